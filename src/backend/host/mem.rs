//! The host's memory: 64-byte aligned storage, and one table per executable from
//! buffer ids to addresses (variables resident in the device, everything else owned
//! by the executable), with typed access for the native kernels and the seam.

use super::lower::{Elem, View};
use crate::backend::pool::{Pool, MIN_SPLIT};
use crate::ir::DType;
use crate::tensor::{Data, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

/// Zeroed, page-aligned bytes that never move: an anonymous mapping, so that the
/// kernel zeroes each page on its first touch and nothing zeroes it twice (a zeroed
/// `Vec` cost mnist_cnn's start 30 ms for its 65 MiB arena), and pages an executable
/// never touches cost nothing.
///
/// Not on transparent huge pages: `madvise(MADV_HUGEPAGE)` made touching the arena
/// 3.5x cheaper in a fresh process (12 ms against 45 ms for 65 MiB), but right after
/// LLVM has compiled, the kernel compacts memory to find them, and mnist_cnn's first
/// step cold took 0.60 s against 0.52 s (1 thread, 3 alternating runs); steady steps
/// were the same either way.
pub struct Storage {
    map: *mut libc::c_void,
    len: usize,
}

// SAFETY: Storage owns its mapping; what is written through `ptr` is the caller's
// business (see `Mem`).
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// `bytes` zeroed bytes; an error (not an abort) when the memory is not there.
    pub fn new(bytes: usize) -> Result<Storage, String> {
        let len = bytes.max(1);
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(format!(
                "cannot allocate {}",
                crate::passes::memory::human(bytes as u128)
            ));
        }
        Ok(Storage { map, len })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.map.cast()
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: the mapping is this Storage's own and nothing points into it any more.
        unsafe {
            libc::munmap(self.map, self.len);
        }
    }
}

/// The addresses of an executable's buffers, with their element kinds and sizes.
pub struct Mem {
    ptrs: Vec<*mut u8>,
    elems: Vec<Elem>,
}

// SAFETY: Mem is a table of addresses into storage that outlives it. The tasks of one
// kernel run on several threads at once, and each writes only its own part of the
// kernel's output (`f32s_part`), while the operands they share are only read.
unsafe impl Send for Mem {}
unsafe impl Sync for Mem {}

impl Mem {
    pub fn new(ptrs: Vec<*mut u8>, elems: Vec<Elem>) -> Mem {
        Mem { ptrs, elems }
    }

    pub fn ptr(&self, buf: usize) -> *mut u8 {
        self.ptrs[buf]
    }

    /// Buffer `buf` is at `ptr` from now on.
    pub fn set_ptr(&mut self, buf: usize, ptr: *mut u8) {
        self.ptrs[buf] = ptr;
    }

    /// The number of buffers.
    pub fn len(&self) -> usize {
        self.ptrs.len()
    }

    pub fn elem(&self, v: &View) -> Elem {
        self.elems[v.buf]
    }

    fn contiguous_len(v: &View) -> usize {
        debug_assert!(v.is_contiguous());
        v.len()
    }

    /// The bytes of a contiguous view.
    pub fn bytes(&self, v: &View) -> &[u8] {
        let size = self.elem(v).size();
        // SAFETY: the view lies within its buffer.
        unsafe {
            std::slice::from_raw_parts(
                self.ptrs[v.buf].add(v.offset as usize * size),
                Self::contiguous_len(v) * size,
            )
        }
    }

    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, v: &View) -> &mut [u8] {
        let size = self.elem(v).size();
        // SAFETY: as bytes; callers write only buffers no other slice borrows.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptrs[v.buf].add(v.offset as usize * size),
                Self::contiguous_len(v) * size,
            )
        }
    }

    /// The f32 elements of a contiguous view.
    pub fn f32s(&self, v: &View) -> &[f32] {
        let b = self.bytes(v);
        // SAFETY: an f32 buffer, aligned to 64 bytes plus a multiple of 4.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / 4) }
    }

    #[allow(clippy::mut_from_ref)]
    pub fn f32s_mut(&self, v: &View) -> &mut [f32] {
        let b = self.bytes_mut(v);
        // SAFETY: as f32s.
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len() / 4) }
    }

    /// Elements `lo..hi` of a contiguous f32 view: the part of one task of a split
    /// kernel, which no other task reads or writes.
    #[allow(clippy::mut_from_ref)]
    pub fn f32s_part(&self, v: &View, lo: usize, hi: usize) -> &mut [f32] {
        debug_assert!(lo <= hi && hi <= v.len());
        // SAFETY: within the view (hi <= its length), which lies within its buffer.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.ptrs[v.buf] as *mut f32).add(v.offset as usize + lo),
                hi - lo,
            )
        }
    }

    pub fn put_f32s(&self, v: &View, x: &[f32]) {
        self.f32s_mut(v).copy_from_slice(x);
    }

    /// Element `i` of a contiguous integer (or boolean) view, widened.
    pub fn int(&self, v: &View, i: usize) -> i64 {
        let b = self.bytes(v);
        match self.elem(v) {
            Elem::U8 => i64::from(b[i]),
            Elem::I32 => i64::from(i32::from_ne_bytes([
                b[4 * i],
                b[4 * i + 1],
                b[4 * i + 2],
                b[4 * i + 3],
            ])),
            Elem::I64 => {
                let mut x = [0; 8];
                x.copy_from_slice(&b[8 * i..8 * i + 8]);
                i64::from_ne_bytes(x)
            }
            Elem::F32 => 0,
        }
    }

    /// The integer (or boolean) elements of a contiguous view, widened, in order.
    pub fn ints<'m>(&'m self, v: &'m View) -> impl Iterator<Item = i64> + 'm {
        (0..Self::contiguous_len(v)).map(move |i| self.int(v, i))
    }

    /// The first element of a view as f64: the value of a scalar (the loss, the
    /// learning rate), read without making a tensor.
    pub fn scalar(&self, v: &View) -> f64 {
        let at = View {
            buf: v.buf,
            offset: v.offset,
            shape: Vec::new(),
            strides: Vec::new(),
        };
        match self.elem(v) {
            Elem::F32 => f64::from(self.f32s(&at)[0]),
            _ => self.int(&at, 0) as f64,
        }
    }

    /// Writes integers, in order, into a contiguous view of an integer buffer.
    pub fn put_int_iter(&self, v: &View, x: impl Iterator<Item = i64>) {
        let b = self.bytes_mut(v);
        match self.elem(v) {
            Elem::U8 => b.iter_mut().zip(x).for_each(|(o, i)| *o = i as u8),
            Elem::I32 => b
                .chunks_exact_mut(4)
                .zip(x)
                .for_each(|(o, i)| o.copy_from_slice(&(i as i32).to_ne_bytes())),
            Elem::I64 => b
                .chunks_exact_mut(8)
                .zip(x)
                .for_each(|(o, i)| o.copy_from_slice(&i.to_ne_bytes())),
            Elem::F32 => {}
        }
    }

    /// A view's value (any strides), as a tensor of `dtype`.
    pub fn read(&self, v: &View, dtype: DType) -> Tensor {
        let pos = v.positions();
        let base = self.ptrs[v.buf];
        let shape = ndarray::IxDyn(&v.shape);
        // SAFETY: every position lies within the buffer.
        unsafe {
            match self.elems[v.buf] {
                Elem::F32 => {
                    let p = base as *const f32;
                    let x: Vec<f32> = pos.iter().map(|&i| *p.add(i)).collect();
                    Tensor::float(
                        dtype,
                        ndarray::ArcArray::from_shape_vec(shape, x).expect("shape"),
                    )
                }
                Elem::U8 if dtype == DType::Bool => {
                    let x: Vec<bool> = pos.iter().map(|&i| *base.add(i) != 0).collect();
                    Tensor::bool(ndarray::ArcArray::from_shape_vec(shape, x).expect("shape"))
                }
                e => {
                    let x: Vec<i64> = pos
                        .iter()
                        .map(|&i| match e {
                            Elem::U8 => i64::from(*base.add(i)),
                            Elem::I32 => i64::from(*(base as *const i32).add(i)),
                            _ => *(base as *const i64).add(i),
                        })
                        .collect();
                    Tensor::int(
                        dtype,
                        ndarray::ArcArray::from_shape_vec(shape, x).expect("shape"),
                    )
                }
            }
        }
    }

    /// Writes a tensor into a contiguous view (its type was checked).
    pub fn write(&self, v: &View, t: &Tensor, pool: &Pool) {
        match &t.data {
            Data::F(a) => match a.as_slice() {
                // a batch as the pipeline stacks it: one copy, split over the threads
                Some(src) if src.len() == v.len() => pool.split(src.len(), MIN_SPLIT, &|lo, hi| {
                    self.f32s_part(v, lo, hi).copy_from_slice(&src[lo..hi])
                }),
                _ => {
                    let dst = self.f32s_mut(v);
                    dst.iter_mut().zip(a.iter()).for_each(|(o, &x)| *o = x)
                }
            },
            Data::I(a) => match a.as_slice() {
                Some(src) => self.put_int_iter(v, src.iter().copied()),
                None => self.put_int_iter(v, a.iter().copied()),
            },
            Data::B(a) => {
                let dst = self.bytes_mut(v);
                for (o, &x) in dst.iter_mut().zip(a.iter()) {
                    *o = u8::from(x);
                }
            }
            Data::S(_) => {}
        }
    }

    /// Copies a view's elements into a contiguous view of the same shape and element
    /// kind (a plain copy when both are contiguous).
    pub fn copy(&self, from: &View, to: &View, pool: &Pool) {
        let size = self.elem(to).size();
        if from.is_contiguous() {
            let src = self.bytes(from).as_ptr() as usize;
            let dst = self.bytes_mut(to);
            let (at, len) = (dst.as_mut_ptr() as usize, dst.len());
            pool.split(len, MIN_SPLIT * 4, &|lo, hi| {
                // SAFETY: both ranges lie within their buffers; they may overlap only
                // when they are the same range (a variable kept as it was), which copy
                // allows; the threads' parts are disjoint.
                unsafe { std::ptr::copy((src + lo) as *const u8, (at + lo) as *mut u8, hi - lo) }
            });
            return;
        }
        let dst = self.bytes_mut(to);
        let base = self.ptrs[from.buf];
        for (i, p) in from.positions().into_iter().enumerate() {
            // SAFETY: every position lies within the buffer.
            let src = unsafe { std::slice::from_raw_parts(base.add(p * size), size) };
            dst[i * size..(i + 1) * size].copy_from_slice(src);
        }
    }

    /// The first element of a float view that fails `bad`: (flat index, value).
    pub fn first(&self, v: &View, bad: impl Fn(f32) -> bool, pool: &Pool) -> Option<(usize, f32)> {
        if self.elems[v.buf] != Elem::F32 {
            return None;
        }
        let p = self.ptrs[v.buf] as *const f32;
        if v.is_contiguous() {
            let s = self.f32s(v);
            // the common case, all finite, is one vectorised pass (split over the
            // threads)
            let bad_part = AtomicBool::new(false);
            pool.split(s.len(), MIN_SPLIT, &|lo, hi| {
                if !crate::tensor::all_finite(&s[lo..hi]) {
                    bad_part.store(true, Ordering::Relaxed);
                }
            });
            if !bad_part.into_inner() {
                return None;
            }
            return s
                .iter()
                .enumerate()
                .find(|(_, &x)| bad(x))
                .map(|(i, &x)| (i, x));
        }
        v.positions()
            .into_iter()
            .enumerate()
            // SAFETY: positions lie within the buffer.
            .map(|(i, q)| (i, unsafe { *p.add(q) }))
            .find(|&(_, x)| bad(x))
    }
}
