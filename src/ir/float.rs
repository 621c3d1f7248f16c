//! The float semantics every backend and every folding pass follows where IEEE 754
//! leaves a choice: how NaN goes through `maximum`, `minimum`, `relu`, `sign`, the
//! extremum reductions, arg-reductions and max pooling. The rule is NumPy's (and
//! TensorFlow's, PyTorch's and JAX's): NaN propagates. A NaN operand makes a NaN
//! result, and an arg-reduction or a pooling window picks the first NaN it meets, so
//! that one bad value is seen, never silently replaced by a number.

/// The float types the kernels compute in.
pub trait Float: Copy + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    fn is_nan(self) -> bool;
    fn neg(self) -> Self;
}

impl Float for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn neg(self) -> f32 {
        -self
    }
}

impl Float for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn neg(self) -> f64 {
        -self
    }
}

/// `maximum(a, b)`: NaN if either is NaN; `a` on ties (NumPy's `fmax` ignores NaN,
/// `maximum` does not: this is `maximum`).
pub fn maximum<T: Float>(a: T, b: T) -> T {
    if a.is_nan() || a >= b {
        a
    } else {
        b
    }
}

/// `minimum(a, b)`: NaN if either is NaN; `a` on ties.
pub fn minimum<T: Float>(a: T, b: T) -> T {
    if a.is_nan() || a <= b {
        a
    } else {
        b
    }
}

/// Whether `maximum(a, b)` (or `minimum` when `max` is false) takes its value from `a`:
/// the rule the gradient of both follows, so that it flows to the operand the result
/// came from, NaN included.
pub fn takes_first<T: Float>(a: T, b: T, max: bool) -> bool {
    a.is_nan() || if max { a >= b } else { a <= b }
}

/// `relu(x)`: `x` when positive, NaN when NaN, else 0.
pub fn relu<T: Float>(x: T) -> T {
    if x > T::ZERO || x.is_nan() {
        x
    } else {
        T::ZERO
    }
}

/// `sign(x)`: -1, 0 or 1; NaN when NaN.
pub fn sign<T: Float>(x: T) -> T {
    if x > T::ZERO {
        T::ONE
    } else if x < T::ZERO {
        T::ONE.neg()
    } else if x.is_nan() {
        x
    } else {
        T::ZERO
    }
}

/// The error function in f64, to within 1e-14 relative: its Taylor series below 2.5
/// (whose terms peak near 18 there, so little is lost to cancellation), `1 - erfc`
/// from erfc's continued fraction up to 6 (60 terms, evaluated from the tail), and
/// +-1 beyond (erfc(6) is 2e-17). The interpreter, the wafer's software operation and
/// constant folding all compute it so, then round to the tensor's type.
pub fn erf(x: f64) -> f64 {
    if x == 0.0 {
        return x; // (-0 stays -0)
    }
    let a = x.abs();
    if a < 2.5 {
        let x2 = x * x;
        let (mut term, mut sum) = (x, x);
        for n in 1..100 {
            term *= -x2 / f64::from(n);
            let t = term / f64::from(2 * n + 1);
            sum += t;
            if t.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        return std::f64::consts::FRAC_2_SQRT_PI * sum;
    }
    if a > 6.0 {
        return 1.0f64.copysign(x);
    }
    // erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...))))
    let mut f = a;
    for k in (1..=60).rev() {
        f = a + f64::from(k) / 2.0 / f;
    }
    let erfc = (-a * a).exp() * (std::f64::consts::FRAC_2_SQRT_PI / 2.0) / f;
    (1.0 - erfc).copysign(x)
}

/// Whether `v` replaces `best` as the running extremum of a window or an
/// arg-reduction: a greater (smaller) value does, and the first NaN does and is never
/// replaced.
pub fn beats<T: Float>(v: T, best: T, max: bool) -> bool {
    if best.is_nan() {
        return false;
    }
    v.is_nan() || if max { v > best } else { v < best }
}

/// A float cast to an integer dtype, as NumPy (and TensorFlow) compute it on x86:
/// truncated toward zero; a NaN, an infinity or a value beyond `i32` (`i64`) is the
/// dtype's "integer indefinite", its smallest value, so that a NaN class label is
/// caught as out of range rather than read as class 0; `u8` keeps the low byte of the
/// truncated value (300.0 is 44, -1.7 is 255), NaN and infinities give 0.
pub fn to_int(v: f64, to: super::DType) -> i64 {
    use super::DType;
    match to {
        DType::U8 if v.is_finite() => i64::from((v as i64) as u8),
        DType::U8 | DType::Bool => 0,
        // Beyond these, the truncated value does not fit (NaN and infinities are too).
        DType::I32 if v > -2_147_483_649.0 && v < 2_147_483_648.0 => v as i64,
        DType::I32 => i64::from(i32::MIN),
        _ if (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&v) => v as i64,
        _ => i64::MIN,
    }
}
