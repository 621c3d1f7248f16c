//! Counter-based random numbers (Philox 4x32-10, as JAX and TensorFlow's stateless ops
//! use). A number is a pure function of (run seed, stream, step, element index): the key
//! comes from the seed and the op's stable identity (`stream`), the counter from the
//! element index and the global step. So results do not depend on threads or shards,
//! and a resumed run needs only the step to continue the same stream.
//!
//! Initialisers follow Keras's definitions (fans of a conv kernel count its receptive
//! field; the truncated normals are rescaled by 0.8796 and redrawn beyond two standard
//! deviations).

use crate::ir::{Init, TensorType};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox 4x32 block: ten rounds.
pub fn philox(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
    for _ in 0..10 {
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k[0] = k[0].wrapping_add(W0);
        k[1] = k[1].wrapping_add(W1);
    }
    c
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A generator for one (seed, stream) pair.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    key: [u32; 2],
}

impl Stream {
    pub fn new(seed: u64, stream: u64) -> Stream {
        let k = splitmix(seed ^ splitmix(stream));
        Stream {
            key: [k as u32, (k >> 32) as u32],
        }
    }

    fn block(&self, index: u64, step: u64) -> [u32; 4] {
        philox(
            [
                index as u32,
                (index >> 32) as u32,
                step as u32,
                (step >> 32) as u32,
            ],
            self.key,
        )
    }

    /// Uniform in [0, 1) for element `index` at `step`.
    pub fn uniform(&self, index: u64, step: u64) -> f32 {
        let b = self.block(index / 4, step);
        (b[(index % 4) as usize] >> 8) as f32 * (1.0 / 16_777_216.0)
    }

    /// `n` uniforms for elements `first..first + n` at `step`.
    pub fn uniforms(&self, first: u64, n: usize, step: u64) -> Vec<f32> {
        let mut out = vec![0.0; n];
        self.fill_uniforms(first, &mut out, step);
        out
    }

    /// The uniforms of elements `first..first + out.len()` at `step`, into `out`.
    pub fn fill_uniforms(&self, first: u64, out: &mut [f32], step: u64) {
        let mut i = first;
        let mut o = out.iter_mut();
        while o.len() > 0 {
            let b = self.block(i / 4, step);
            for (&x, v) in b[(i % 4) as usize..].iter().zip(o.by_ref()) {
                *v = (x >> 8) as f32 * (1.0 / 16_777_216.0);
                i += 1;
            }
        }
    }

    /// A standard normal for element `index` at `step` (Box-Muller on one block).
    pub fn normal(&self, index: u64, step: u64) -> f32 {
        let b = self.block(index, step);
        let u1 = (f64::from(b[0] >> 8) + 1.0) / 16_777_216.0; // (0, 1]
        let u2 = f64::from(b[1] >> 8) / 16_777_216.0;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// A standard normal redrawn until it lies within two standard deviations.
    pub fn truncated_normal(&self, index: u64) -> f32 {
        for attempt in 0..64 {
            let z = self.normal(index, attempt);
            if z.abs() <= 2.0 {
                return z;
            }
        }
        0.0
    }
}

/// The stable identity of a named thing (a variable): FNV-1a of its name.
pub fn name_stream(name: &str) -> u64 {
    crate::hash::fnv1a(crate::hash::FNV_OFFSET, name.as_bytes())
}

/// Keras's fans: a kernel's last two axes are (in, out) and the rest its receptive field.
pub fn fans(shape: &[usize]) -> (f64, f64) {
    match shape.len() {
        0 => (1.0, 1.0),
        1 => (shape[0] as f64, shape[0] as f64),
        2 => (shape[0] as f64, shape[1] as f64),
        r => {
            let field: usize = shape[..r - 2].iter().product();
            ((field * shape[r - 2]) as f64, (field * shape[r - 1]) as f64)
        }
    }
}

/// The initial values of variable `name` of type `ty`.
pub fn init_values(init: &Init, name: &str, ty: &TensorType, seed: u64) -> Vec<f32> {
    let n = ty.elements();
    let s = Stream::new(seed, name_stream(name));
    let (fan_in, fan_out) = fans(&ty.shape);
    let uniform = |limit: f64| -> Vec<f32> {
        s.uniforms(0, n, 0)
            .into_iter()
            .map(|u| ((2.0 * f64::from(u) - 1.0) * limit) as f32)
            .collect()
    };
    let truncated = |stddev: f64| -> Vec<f32> {
        (0..n as u64)
            .map(|i| (f64::from(s.truncated_normal(i)) * stddev) as f32)
            .collect()
    };
    // Keras rescales so that the truncated distribution has the wanted variance.
    const TRUNC: f64 = 0.879_625_661_034_239_8;
    match init {
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
        Init::Constant { bits } => vec![f32::from_bits(*bits); n],
        Init::GlorotUniform => uniform((6.0 / (fan_in + fan_out)).sqrt()),
        Init::HeUniform => uniform((6.0 / fan_in).sqrt()),
        Init::GlorotNormal => truncated((2.0 / (fan_in + fan_out)).sqrt() / TRUNC),
        Init::HeNormal => truncated((2.0 / fan_in).sqrt() / TRUNC),
        Init::LecunNormal => truncated((1.0 / fan_in).sqrt() / TRUNC),
        Init::Uniform { lo_bits, hi_bits } => {
            let (lo, hi) = (f32::from_bits(*lo_bits), f32::from_bits(*hi_bits));
            s.uniforms(0, n, 0)
                .into_iter()
                .map(|u| lo + (hi - lo) * u)
                .collect()
        }
        Init::Normal { stddev_bits } => {
            let sd = f32::from_bits(*stddev_bits);
            (0..n as u64).map(|i| s.normal(i, 0) * sd).collect()
        }
        Init::TruncatedNormal { stddev_bits } => truncated(f64::from(f32::from_bits(*stddev_bits))),
    }
}
