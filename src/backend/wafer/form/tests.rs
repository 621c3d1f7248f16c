use super::*;

fn train_graph(src: &str) -> Graph {
    crate::backend::wafer::testing::graph(src, crate::syntax::ast::SectionKind::Train)
}

#[test]
fn an_mlp_forms_dense_and_vector_kernels_in_a_chain() {
    let g = train_graph(&crate::backend::wafer::testing::mlp(8, 16, 4, 4));
    let f = form(&g).unwrap();
    let kinds: Vec<&str> = f
        .kernels
        .iter()
        .map(|k| match k.kind {
            Kind::Dense { .. } => "dense",
            Kind::Vector { .. } => "vector",
        })
        .collect();
    assert_eq!(kinds, ["dense", "vector", "dense", "vector"]);
    // the first layer sends no input gradient; the second does
    assert!(matches!(
        f.kernels[0].kind,
        Kind::Dense {
            bwd: None,
            dw: Some(_),
            ..
        }
    ));
    assert!(matches!(
        f.kernels[2].kind,
        Kind::Dense {
            bwd: Some(_),
            dw: Some(_),
            ..
        }
    ));
    // each kernel updates its own variables: the weights and biases with their
    // momentum slots
    let commits: Vec<usize> = f.kernels.iter().map(|k| k.commits.len()).collect();
    assert_eq!(commits, [2, 2, 2, 2]);
    // features -> dense, dense -> vector (y), vector -> dense (relu), dense -> vector
    // (logits), labels -> vector; and back: vector -> dense (dlogits), dense ->
    // vector (dx), vector -> dense (relu grad)
    let s: Vec<(End, Vec<End>, bool)> = f
        .streams
        .iter()
        .map(|s| (s.from, s.to.clone(), s.bwd))
        .collect();
    use End::{Host, Kernel as K};
    assert_eq!(
        s,
        [
            (Host, vec![K(0)], false),
            (Host, vec![K(3)], false),
            (K(0), vec![K(1)], false),
            (K(1), vec![K(2)], false),
            (K(2), vec![K(3)], false),
            (K(3), vec![K(2)], true),
            (K(2), vec![K(1)], true),
            (K(1), vec![K(0)], true),
        ]
    );
    // the learning rate is the host's
    assert!(f.kernels.iter().all(|k| k.hosts.is_empty()));
}

#[test]
fn a_weight_of_several_layers_is_held_by_each_and_updated_by_the_host() {
    let g = train_graph(RECURRENT);
    let f = form(&g).unwrap();
    let wh = g.variable("wh").unwrap();
    let holders: Vec<usize> = (0..f.kernels.len())
        .filter(|&k| f.kernels[k].vars.contains(&wh))
        .collect();
    // its two layers, and nothing else
    assert_eq!(holders.len(), 2);
    assert!(holders
        .iter()
        .all(|&k| matches!(f.kernels[k].kind, Kind::Dense { w, dw: Some(_), .. } if w == wh)));
    // the host updates it (from the sum of both gradients); the other layers'
    // updates stay theirs
    let names: Vec<&str> = f.host_commits.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["wh"]);
    assert!(f.mixed.contains(&f.host_commits[0].1));
    assert!(holders.iter().all(|&k| f.kernels[k].commits.is_empty()));
    let on_kernels: usize = f.kernels.iter().map(|k| k.commits.len()).sum();
    assert_eq!(on_kernels, 4);
    // a chain still: each kernel's forward output feeds the next
    assert!(f.streams.iter().filter(|s| !s.bwd).all(|s| match s.from {
        End::Kernel(a) => s.to == [End::Kernel(a + 1)],
        End::Host => true,
    }));
}

const RECURRENT: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
model m(features: f32[B, 8], labels: i32[B]) {
  let wh = variable("wh", [16, 16], init: init_normal(0.1))
  let h = dense(features, 16, activation: relu)
  h = tanh(matmul(h, wh))
  h = tanh(matmul(h, wh))
  let logits = dense(h, 4)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
}
input data() { range(64) |> map |i| (broadcast_to(cast(i, f32), [8]), i % 4) |> repeat |> batch(4, drop_remainder: true) }
estimator e { model = m  train_input = data() }
"#;
