//! A host train step allocates nothing once the executable runs: the buffers are in the
//! arena of the static memory plan, the variables resident, and every scratch of a
//! native kernel is planned too. A counting global allocator (this test binary's own)
//! counts the allocations of every thread while steps run (the pool's workers
//! included).

#![cfg(feature = "llvm")]

use est::backend::{self, Feeds, StepCtx};
use est::elab::Target;
use est::ir::Op;
use est::span::Span;
use est::syntax::ast::SectionKind;
use est::tensor::Tensor;
use est::{CheckOptions, Program};
use rustc_hash::FxHashMap;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, size) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// A batch for `g`'s inputs: floats in [0, 1), integers (labels) in [0, 10).
fn batch(g: &est::ir::Graph, seed: u64) -> Feeds {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut feeds = Feeds::default();
    for n in g.topo_order() {
        let node = g.node(n);
        if let Op::Input { name } = &node.op {
            let len = node.ty.shape.iter().product();
            let vals: Vec<f64> = (0..len)
                .map(|_| match node.ty.dtype {
                    d if d.is_float() => next(),
                    _ => (next() * 10.0).floor(),
                })
                .collect();
            feeds.insert(name.clone(), Tensor::from_f64(&node.ty, vals));
        }
    }
    feeds
}

/// The allocations of `steps` host train steps of `file` (with `params` overridden),
/// after two steps of warm-up, on `threads` threads.
fn allocations(file: &str, params: &[(&str, &str)], threads: usize, steps: u64) -> usize {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut p = Program::load(&root.join(file)).expect("the example loads");
    for (k, v) in params {
        p.add_override(k, v, "test");
    }
    let checked = est::check(
        &p,
        &CheckOptions {
            modes: vec![SectionKind::Train],
            ..Default::default()
        },
    );
    assert!(!checked.has_errors(), "{:?}", checked.diags);
    let g = checked.graphs[0].graph.clone();
    let at = Span::default();
    let mut d = backend::open(Target::Host, at, threads).expect("a host device");
    let exe = d.compile_train(g.clone(), at).expect("it compiles");
    let mut vars = FxHashMap::default();
    for n in g.topo_order() {
        let node = g.node(n);
        if let Op::Variable { name, .. } = &node.op {
            let len: usize = node.ty.shape.iter().product();
            let vals = (0..len).map(|i| ((i % 7) as f64 - 3.0) * 0.01).collect();
            vars.insert(name.clone(), Tensor::from_f64(&node.ty, vals));
        }
    }
    d.bind(vars).expect("the variables fit");
    let mut count = 0;
    for step in 0..2 + steps {
        let batches = vec![batch(&g, step)];
        let ctx = StepCtx {
            step: step as i64,
            seed: 1,
        };
        let before = ALLOCS.load(Ordering::Relaxed);
        let out = d
            .train_step(exe, batches, ctx, &mut est::backend::Alone)
            .expect("the step runs");
        let after = ALLOCS.load(Ordering::Relaxed);
        assert!(out.loss.is_finite(), "loss {}", out.loss);
        if step >= 2 {
            count += after - before;
        }
    }
    count
}

#[test]
fn host_train_steps_allocate_nothing() {
    for threads in [1, 2] {
        let fc = allocations("examples/fc_mnist.est", &[], threads, 5);
        assert_eq!(
            fc, 0,
            "fc_mnist, {threads} threads: {fc} allocations in 5 steps"
        );
        let cnn = allocations("examples/mnist_cnn.est", &[("hidden", "[128]")], threads, 3);
        assert_eq!(
            cnn, 0,
            "mnist_cnn, {threads} threads: {cnn} allocations in 3 steps"
        );
    }
}
