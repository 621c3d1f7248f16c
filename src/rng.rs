//! Counter-based random numbers (Philox 4x32-10, as JAX and TensorFlow's stateless ops
//! use). A number is a pure function of (run seed, stream, step, element index): the key
//! comes from the seed and the op's stable identity (`stream`), the counter from the
//! element index and the global step. So results do not depend on threads or shards,
//! and a resumed run needs only the step to continue the same stream.
//!
//! Initialisers follow Keras's definitions (fans of a conv kernel count its receptive
//! field; the truncated normals are rescaled by 0.8796 and redrawn beyond two standard
//! deviations).

use crate::ir::{Distribution, FanMode, Init, TensorType};

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
        Init::VarianceScaling {
            scale_bits,
            mode,
            distribution,
        } => {
            let fan = match mode {
                FanMode::FanIn => fan_in,
                FanMode::FanOut => fan_out,
                FanMode::FanAvg => (fan_in + fan_out) / 2.0,
            };
            let var = f64::from(f32::from_bits(*scale_bits)) / fan.max(1.0);
            match distribution {
                Distribution::TruncatedNormal => truncated(var.sqrt() / TRUNC),
                Distribution::UntruncatedNormal => (0..n as u64)
                    .map(|i| (f64::from(s.normal(i, 0)) * var.sqrt()) as f32)
                    .collect(),
                Distribution::Uniform => uniform((3.0 * var).sqrt()),
            }
        }
        Init::Orthogonal { gain_bits } => {
            orthogonal(&s, &ty.shape, f64::from(f32::from_bits(*gain_bits)))
        }
        Init::As { init, name } => init_values(init, name, ty, seed),
    }
}

/// Keras's orthogonal initialiser: the shape flattened to `[rows, cols]` (`cols` the
/// last axis), a standard normal matrix of the taller orientation decomposed as `QR`
/// (Householder), `Q`'s columns signed by `R`'s diagonal (so that the result is
/// uniform over orthogonal matrices), transposed back when it was wide, times `gain`.
fn orthogonal(s: &Stream, shape: &[usize], gain: f64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Vec::new();
    }
    let cols = shape.last().copied().unwrap_or(1).max(1);
    let rows = n / cols;
    let (m, k) = (rows.max(cols), rows.min(cols));
    // a: m x k, column-major, drawn row by row of the [m, k] normal matrix
    let mut a = vec![0f64; m * k];
    for i in 0..m {
        for j in 0..k {
            a[j * m + i] = f64::from(s.normal((i * k + j) as u64, 0));
        }
    }
    // Householder QR: the reflections kept in `a`'s lower part, R's diagonal in `d`
    let mut d = vec![0f64; k];
    let mut vs: Vec<Vec<f64>> = Vec::with_capacity(k);
    for j in 0..k {
        let col = &a[j * m..(j + 1) * m];
        let norm = col[j..].iter().map(|x| x * x).sum::<f64>().sqrt();
        let alpha = if col[j] > 0.0 { -norm } else { norm };
        let mut v: Vec<f64> = col[j..].to_vec();
        v[0] -= alpha;
        let vn = v.iter().map(|x| x * x).sum::<f64>();
        d[j] = alpha;
        if vn > 0.0 {
            for c in j..k {
                let cc = &mut a[c * m + j..(c + 1) * m];
                let dot: f64 = v.iter().zip(cc.iter()).map(|(p, q)| p * q).sum();
                let f = 2.0 * dot / vn;
                for (q, p) in cc.iter_mut().zip(&v) {
                    *q -= f * p;
                }
            }
        }
        vs.push(v);
    }
    // Q's first k columns: the reflections applied to the identity's, in reverse
    let mut q = vec![0f64; m * k];
    for j in 0..k {
        q[j * m + j] = 1.0;
    }
    for (j, v) in vs.iter().enumerate().rev() {
        let vn = v.iter().map(|x| x * x).sum::<f64>();
        if vn == 0.0 {
            continue;
        }
        for c in 0..k {
            let cc = &mut q[c * m + j..(c + 1) * m];
            let dot: f64 = v.iter().zip(cc.iter()).map(|(p, q)| p * q).sum();
            let f = 2.0 * dot / vn;
            for (x, p) in cc.iter_mut().zip(v) {
                *x -= f * p;
            }
        }
    }
    let mut out = vec![0f32; n];
    for j in 0..k {
        let sign = if d[j] < 0.0 { -1.0 } else { 1.0 };
        for i in 0..m {
            let v = (q[j * m + i] * sign * gain) as f32;
            // [m, k] is [rows, cols] when tall, its transpose when wide
            if rows >= cols {
                out[i * cols + j] = v;
            } else {
                out[j * cols + i] = v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    fn values(init: &Init, shape: &[usize]) -> Vec<f64> {
        let ty = TensorType::new(DType::F32, shape.to_vec());
        init_values(init, "w", &ty, 11)
            .into_iter()
            .map(f64::from)
            .collect()
    }

    /// `[rows, cols]` values' Gram matrix of the narrower side: the identity times
    /// `gain^2` when the values are orthogonal.
    fn gram_error(v: &[f64], rows: usize, cols: usize, gain: f64) -> f64 {
        let (tall, k) = (rows >= cols, rows.min(cols));
        let at = |i: usize, j: usize| v[i * cols + j];
        let mut worst = 0f64;
        for p in 0..k {
            for q in 0..k {
                let dot: f64 = if tall {
                    (0..rows).map(|i| at(i, p) * at(i, q)).sum()
                } else {
                    (0..cols).map(|j| at(p, j) * at(q, j)).sum()
                };
                let want = if p == q { gain * gain } else { 0.0 };
                worst = worst.max((dot - want).abs());
            }
        }
        worst
    }

    #[test]
    fn orthogonal_kernels_are_orthogonal_tall_wide_and_convolutional() {
        let o = |g: f32| Init::Orthogonal {
            gain_bits: g.to_bits(),
        };
        assert!(gram_error(&values(&o(1.0), &[64, 16]), 64, 16, 1.0) < 1e-5);
        assert!(gram_error(&values(&o(1.0), &[16, 64]), 16, 64, 1.0) < 1e-5);
        assert!(gram_error(&values(&o(2.0), &[32, 32]), 32, 32, 2.0) < 4e-5);
        // a [3, 3, 8, 16] kernel is [72, 16] flattened
        assert!(gram_error(&values(&o(1.0), &[3, 3, 8, 16]), 72, 16, 1.0) < 1e-5);
        // not merely the identity: a seed's matrix differs from another's
        let a = values(&o(1.0), &[8, 8]);
        let b = init_values(&o(1.0), "w", &TensorType::new(DType::F32, vec![8, 8]), 12);
        assert!(a
            .iter()
            .zip(&b)
            .any(|(x, y)| (x - f64::from(*y)).abs() > 1e-3));
    }

    #[test]
    fn variance_scaling_has_the_variance_of_its_fan() {
        // [400, 100]: fan_in 400, fan_out 100, fan_avg 250; 40,000 draws, so a sample
        // variance lies within 3% of the true one with overwhelming probability
        for (mode, fan) in [
            (FanMode::FanIn, 400.0),
            (FanMode::FanOut, 100.0),
            (FanMode::FanAvg, 250.0),
        ] {
            for dist in [
                Distribution::TruncatedNormal,
                Distribution::UntruncatedNormal,
                Distribution::Uniform,
            ] {
                let init = Init::VarianceScaling {
                    scale_bits: 2f32.to_bits(),
                    mode,
                    distribution: dist,
                };
                let v = values(&init, &[400, 100]);
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
                let want = 2.0 / fan;
                assert!(
                    (var / want - 1.0).abs() < 0.03,
                    "{mode:?} {dist:?}: variance {var} against {want}"
                );
                let bound = match dist {
                    Distribution::TruncatedNormal => 2.0 * want.sqrt() / 0.879_625_661_034_239_8,
                    Distribution::Uniform => (3.0 * want).sqrt(),
                    Distribution::UntruncatedNormal => f64::INFINITY,
                };
                assert!(
                    v.iter().all(|x| x.abs() <= bound * 1.000_001),
                    "{mode:?} {dist:?}"
                );
            }
        }
    }
}
