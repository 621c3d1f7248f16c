//! 2-D window ops over NHWC data (convolution through im2col, pooling and their
//! gradients), written once over plain slices and used by the interpreter and the host.

use crate::ir::float;
use crate::ir::Padding;

/// The geometry of a 2-D window op over NHWC data.
#[derive(Debug, Clone, Copy)]
pub struct Geo {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub pt: usize,
    pub pl: usize,
}

impl Geo {
    /// The geometry of a window op from input shape `x` (NHWC) to output shape `out`.
    pub fn new(
        x: &[usize],
        out: &[usize],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        padding: Padding,
    ) -> Geo {
        let pad = |len: usize, o: usize, k: usize, s: usize, d: usize| match padding {
            Padding::Valid => 0,
            Padding::Same => {
                let eff = (k - 1) * d + 1;
                (o.saturating_sub(1) * s + eff).saturating_sub(len) / 2
            }
        };
        Geo {
            n: x[0],
            h: x[1],
            w: x[2],
            c: x[3],
            oh: out[1],
            ow: out[2],
            kh: k[0],
            kw: k[1],
            sh: s[0],
            sw: s[1],
            dh: d[0],
            dw: d[1],
            pt: pad(x[1], out[1], k[0], s[0], d[0]),
            pl: pad(x[2], out[2], k[1], s[1], d[1]),
        }
    }

    /// Elements of the input (N, H, W, C).
    pub fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    /// Output pixels (N, OH, OW).
    pub fn pixels(&self) -> usize {
        self.n * self.oh * self.ow
    }

    /// Columns of the patch matrix: kh * kw * c.
    pub fn cols(&self) -> usize {
        self.kh * self.kw * self.c
    }

    /// Calls `f` for every output pixel (its index in N, OH, OW order) with the taps of
    /// its window that fall inside the input, as (tap index `ki * kw + kj`, input pixel
    /// index in N, H, W order). Every window op walks its windows with this.
    pub fn windows(&self, mut f: impl FnMut(usize, &[(usize, usize)])) {
        let mut taps = Vec::with_capacity(self.kh * self.kw);
        for b in 0..self.n {
            for oi in 0..self.oh {
                for oj in 0..self.ow {
                    taps.clear();
                    for ki in 0..self.kh {
                        for kj in 0..self.kw {
                            let i = (oi * self.sh + ki * self.dh).checked_sub(self.pt);
                            let j = (oj * self.sw + kj * self.dw).checked_sub(self.pl);
                            if let (Some(i), Some(j)) = (i, j) {
                                if i < self.h && j < self.w {
                                    taps.push((ki * self.kw + kj, (b * self.h + i) * self.w + j));
                                }
                            }
                        }
                    }
                    f((b * self.oh + oi) * self.ow + oj, &taps);
                }
            }
        }
    }

    /// The patches of `x` as rows of `cols` ([pixels, kh*kw*c]); taps in the padding
    /// are zero.
    pub fn im2col(&self, x: &[f32], cols: &mut [f32]) {
        let (c, width) = (self.c, self.cols());
        cols.fill(0.0);
        self.windows(|p, taps| {
            for &(k, x_at) in taps {
                let dst = p * width + k * c;
                cols[dst..dst + c].copy_from_slice(&x[x_at * c..(x_at + 1) * c]);
            }
        });
    }

    /// The adjoint of `im2col`: patch rows added into `x` (which starts at zero).
    pub fn col2im(&self, cols: &[f32], x: &mut [f32]) {
        let (c, width) = (self.c, self.cols());
        x.fill(0.0);
        self.windows(|p, taps| {
            for &(k, x_at) in taps {
                let src = p * width + k * c;
                for (o, &v) in x[x_at * c..(x_at + 1) * c]
                    .iter_mut()
                    .zip(&cols[src..src + c])
                {
                    *o += v;
                }
            }
        });
    }

    /// Max pooling of `x` into `out`; with `grad = (dy, dx)`, its gradient instead: each
    /// output's dy goes to the first maximum of its window.
    pub fn max_pool(&self, x: &[f32], out: &mut [f32], grad: Option<(&[f32], &mut [f32])>) {
        let c = self.c;
        out.fill(f32::NEG_INFINITY);
        let mut arg = vec![usize::MAX; out.len()];
        self.windows(|p, taps| {
            let o = p * c;
            for &(_, x_at) in taps {
                let src = x_at * c;
                for ch in 0..c {
                    let v = x[src + ch];
                    if arg[o + ch] == usize::MAX || float::beats(v, out[o + ch], true) {
                        out[o + ch] = v;
                        arg[o + ch] = src + ch;
                    }
                }
            }
        });
        if let Some((dy, dx)) = grad {
            dx.fill(0.0);
            for (k, &a) in arg.iter().enumerate() {
                if a != usize::MAX {
                    dx[a] += dy[k];
                }
            }
        }
    }

    /// Average pooling over the window positions inside the input (padding is not
    /// counted, as in TensorFlow).
    pub fn avg_pool(&self, x: &[f32], out: &mut [f32]) {
        let c = self.c;
        out.fill(0.0);
        self.windows(|p, taps| {
            let o = &mut out[p * c..(p + 1) * c];
            for &(_, x_at) in taps {
                for (v, &x) in o.iter_mut().zip(&x[x_at * c..(x_at + 1) * c]) {
                    *v += x;
                }
            }
            let inv = 1.0 / taps.len().max(1) as f32;
            for v in o {
                *v *= inv;
            }
        });
    }

    /// The gradient of `avg_pool`: `dy` spread evenly over each window into `dx`.
    pub fn avg_pool_grad(&self, dy: &[f32], dx: &mut [f32]) {
        let c = self.c;
        dx.fill(0.0);
        self.windows(|p, taps| {
            let inv = 1.0 / taps.len().max(1) as f32;
            let d = &dy[p * c..(p + 1) * c];
            for &(_, x_at) in taps {
                for (o, &v) in dx[x_at * c..(x_at + 1) * c].iter_mut().zip(d) {
                    *o += v * inv;
                }
            }
        });
    }
}
