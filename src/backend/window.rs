//! 2-D window ops over NHWC data (convolution through im2col, pooling and their
//! gradients), written once over plain slices and used by the interpreter and the host.

use crate::ir::float;
use crate::ir::{Conv, Padding, Pool};

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
    /// The geometry of a convolution (or of one of its gradients) from input shape `x`
    /// (NHWC) to output shape `out`, with a `window` (kh, kw) filter.
    pub fn conv(x: &[usize], out: &[usize], window: [usize; 2], c: &Conv) -> Geo {
        Geo::new(x, out, window, c.strides, c.dilation, c.padding)
    }

    /// The geometry of a pooling (or of its gradient) from `x` to `out`.
    pub fn pool(x: &[usize], out: &[usize], p: &Pool) -> Geo {
        Geo::new(x, out, p.window, p.strides, [1, 1], p.padding)
    }

    /// The geometry of a window op from input shape `x` (NHWC) to output shape `out`.
    fn new(
        x: &[usize],
        out: &[usize],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        padding: Padding,
    ) -> Geo {
        let pad = |len: usize, o: usize, k: usize, s: usize, d: usize| {
            crate::ir::window_pad(len, o, (k - 1) * d + 1, s, padding)
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

    /// The extent the windows cover along H and W, from the first one's start (padding
    /// included): `(o - 1) * s + (k - 1) * d + 1`.
    pub fn extent(&self) -> [usize; 2] {
        let extent = |o: usize, k: usize, s: usize, d: usize| {
            o.saturating_sub(1) * s + k.saturating_sub(1) * d + 1
        };
        [
            extent(self.oh, self.kh, self.sh, self.dh),
            extent(self.ow, self.kw, self.sw, self.dw),
        ]
    }

    /// The padding after the last window along H and W: what the windows overrun the
    /// input by, beyond the padding before (`pt`, `pl`; SAME's odd pixel is here).
    pub fn pads_after(&self) -> [usize; 2] {
        let [eh, ew] = self.extent();
        [
            eh.saturating_sub(self.h + self.pt),
            ew.saturating_sub(self.w + self.pl),
        ]
    }

    /// Elements of the input (N, H, W, C).
    pub fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    /// Elements of one image of the input (H, W, C).
    pub fn image_len(&self) -> usize {
        self.h * self.w * self.c
    }

    /// Elements of one image of an output with `channels` channels (OH, OW, channels).
    pub fn out_image_len(&self, channels: usize) -> usize {
        self.oh * self.ow * channels
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

    /// The input row of kernel row `ki` for output row `oi`, if inside the input.
    fn row(&self, oi: usize, ki: usize) -> Option<usize> {
        (oi * self.sh + ki * self.dh)
            .checked_sub(self.pt)
            .filter(|&i| i < self.h)
    }

    /// The input column of kernel column `kj` for output column `oj`, if inside.
    fn col(&self, oj: usize, kj: usize) -> Option<usize> {
        (oj * self.sw + kj * self.dw)
            .checked_sub(self.pl)
            .filter(|&j| j < self.w)
    }

    /// The patches of `x` as rows of `cols` ([pixels, kh*kw*c]); taps in the padding
    /// are zero. Each row is written once: the taps of a kernel row that fall inside
    /// the input are contiguous in both (with unit stride and dilation along W), so
    /// they are one copy.
    pub fn im2col(&self, x: &[f32], cols: &mut [f32]) {
        let (c, width) = (self.c, self.cols());
        let dense = self.sw == 1 && self.dw == 1;
        for b in 0..self.n {
            for oi in 0..self.oh {
                for oj in 0..self.ow {
                    let p = (b * self.oh + oi) * self.ow + oj;
                    let row = &mut cols[p * width..(p + 1) * width];
                    for ki in 0..self.kh {
                        let dst = &mut row[ki * self.kw * c..(ki + 1) * self.kw * c];
                        let Some(i) = self.row(oi, ki) else {
                            dst.fill(0.0);
                            continue;
                        };
                        let base = (b * self.h + i) * self.w;
                        if dense {
                            // kernel columns lo..=hi are inside; lo reads column j
                            let lo = (0..self.kw).find_map(|kj| self.col(oj, kj).map(|j| (kj, j)));
                            let hi = (0..self.kw).rev().find(|&kj| self.col(oj, kj).is_some());
                            match (lo, hi) {
                                (Some((lo, j)), Some(hi)) => {
                                    dst[..lo * c].fill(0.0);
                                    let n = (hi + 1 - lo) * c;
                                    dst[lo * c..lo * c + n]
                                        .copy_from_slice(&x[(base + j) * c..(base + j) * c + n]);
                                    dst[(hi + 1) * c..].fill(0.0);
                                }
                                _ => dst.fill(0.0),
                            }
                        } else {
                            for kj in 0..self.kw {
                                let d = &mut dst[kj * c..(kj + 1) * c];
                                match self.col(oj, kj) {
                                    Some(j) => {
                                        d.copy_from_slice(&x[(base + j) * c..(base + j + 1) * c])
                                    }
                                    None => d.fill(0.0),
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The adjoint of `im2col`: patch rows added into `x` (which starts at zero).
    pub fn col2im(&self, cols: &[f32], x: &mut [f32]) {
        let (c, width) = (self.c, self.cols());
        x.fill(0.0);
        for b in 0..self.n {
            for oi in 0..self.oh {
                for oj in 0..self.ow {
                    let p = (b * self.oh + oi) * self.ow + oj;
                    let row = &cols[p * width..(p + 1) * width];
                    for ki in 0..self.kh {
                        let Some(i) = self.row(oi, ki) else { continue };
                        let base = (b * self.h + i) * self.w;
                        for kj in 0..self.kw {
                            if let Some(j) = self.col(oj, kj) {
                                let src =
                                    &row[(ki * self.kw + kj) * c..(ki * self.kw + kj + 1) * c];
                                let dst = &mut x[(base + j) * c..(base + j + 1) * c];
                                for (o, &v) in dst.iter_mut().zip(src) {
                                    *o += v;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Max pooling of `x` into `out`; with `grad = (dy, dx)`, its gradient instead: each
    /// output's dy goes to the first maximum of its window (taps in row-major order; a
    /// NaN is the maximum once met).
    pub fn max_pool(&self, x: &[f32], out: &mut [f32], grad: Option<(&[f32], &mut [f32])>) {
        let c = self.c;
        let track = grad.is_some();
        let mut arg: Vec<usize> = if track {
            vec![usize::MAX; out.len()]
        } else {
            Vec::new()
        };
        for b in 0..self.n {
            for oi in 0..self.oh {
                for oj in 0..self.ow {
                    let p = (b * self.oh + oi) * self.ow + oj;
                    let o = &mut out[p * c..(p + 1) * c];
                    let mut first = true;
                    for ki in 0..self.kh {
                        let Some(i) = self.row(oi, ki) else { continue };
                        for kj in 0..self.kw {
                            let Some(j) = self.col(oj, kj) else { continue };
                            let src = ((b * self.h + i) * self.w + j) * c;
                            let xs = &x[src..src + c];
                            if first {
                                o.copy_from_slice(xs);
                                if track {
                                    for (ch, a) in arg[p * c..(p + 1) * c].iter_mut().enumerate() {
                                        *a = src + ch;
                                    }
                                }
                                first = false;
                            } else if track {
                                let a = &mut arg[p * c..(p + 1) * c];
                                for ch in 0..c {
                                    if float::beats(xs[ch], o[ch], true) {
                                        o[ch] = xs[ch];
                                        a[ch] = src + ch;
                                    }
                                }
                            } else {
                                for (v, &y) in o.iter_mut().zip(xs) {
                                    if float::beats(y, *v, true) {
                                        *v = y;
                                    }
                                }
                            }
                        }
                    }
                    if first {
                        o.fill(f32::NEG_INFINITY);
                    }
                }
            }
        }
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
