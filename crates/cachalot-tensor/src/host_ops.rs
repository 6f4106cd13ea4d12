//! Elementwise and matrix arithmetic on host bytes: the compute of `cpu` tensors
//! and of the simulated device. Every function works on native-order element
//! bytes of one [`DType`]; integers and bools go through `f64`, which holds every
//! value they take in the examples exactly.

use crate::dtype::DType;
use crate::layout::Layout;

/// An elementwise binary operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b` (logical or for bool).
    Add,
    /// `a * b` (logical and for bool).
    Mul,
}

impl BinaryOp {
    pub(crate) fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
        }
    }

    /// The operation's code in the GPU kernels.
    pub(crate) fn code(self) -> i32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Mul => 1,
        }
    }
}

/// Writes `value` into every element of `out`.
pub(crate) fn fill(dtype: DType, out: &mut [u8], value: f64) {
    let mut one = vec![0u8; dtype.size()];
    dtype.encode(value, &mut one);
    for chunk in out.chunks_exact_mut(dtype.size()) {
        chunk.copy_from_slice(&one);
    }
}

/// The second operand of an elementwise operation: another operand's elements
/// (`T` says where they are), or one number for every element.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Rhs<T> {
    /// `a[i] op b[i]`.
    Each(T),
    /// `a[i] op s`.
    Scalar(f64),
}

impl<T> Rhs<T> {
    /// The same operand with its elements found through `f` (a scalar stays as it is).
    pub(crate) fn try_map<U, E>(self, f: impl FnOnce(T) -> Result<U, E>) -> Result<Rhs<U>, E> {
        Ok(match self {
            Rhs::Each(b) => Rhs::Each(f(b)?),
            Rhs::Scalar(s) => Rhs::Scalar(s),
        })
    }

    /// As [`Rhs::try_map`], for an `f` that cannot fail.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Rhs<U> {
        match self {
            Rhs::Each(b) => Rhs::Each(f(b)),
            Rhs::Scalar(s) => Rhs::Scalar(s),
        }
    }

    /// The operand, borrowed.
    pub(crate) fn borrowed(&self) -> Rhs<&T> {
        match self {
            Rhs::Each(b) => Rhs::Each(b),
            Rhs::Scalar(s) => Rhs::Scalar(*s),
        }
    }
}

/// `out[i] = a[i] op b[i]` or `out[i] = a[i] op s`.
pub(crate) fn elementwise(
    op: BinaryOp,
    dtype: DType,
    out: &mut [u8],
    a: &[u8],
    rhs: Rhs<impl AsRef<[u8]>>,
) {
    let w = dtype.size();
    let outs = out.chunks_exact_mut(w).zip(a.chunks_exact(w));
    match rhs {
        Rhs::Each(b) => {
            for ((o, x), y) in outs.zip(b.as_ref().chunks_exact(w)) {
                dtype.encode(op.apply(dtype.decode(x), dtype.decode(y)), o);
            }
        }
        Rhs::Scalar(s) => {
            for (o, x) in outs {
                dtype.encode(op.apply(dtype.decode(x), s), o);
            }
        }
    }
}

/// The elements of `layout` over `storage`, gathered into row-major order.
pub(crate) fn gather(dtype: DType, storage: &[u8], layout: &Layout) -> Vec<u8> {
    let w = dtype.size();
    let mut out = Vec::with_capacity(layout.numel() * w);
    for i in layout.indices() {
        out.extend_from_slice(&storage[i * w..(i + 1) * w]);
    }
    out
}

/// Row-major `[m, k] x [k, n]` product of two 2-D layouts over their storages.
pub(crate) fn matmul(dtype: DType, a: (&[u8], &Layout), b: (&[u8], &Layout)) -> Vec<u8> {
    let decode = |(bytes, layout): (&[u8], &Layout)| -> Vec<f64> {
        let g = gather(dtype, bytes, layout);
        g.chunks_exact(dtype.size())
            .map(|c| dtype.decode(c))
            .collect()
    };
    let (m, k, n) = (a.1.sizes()[0], a.1.sizes()[1], b.1.sizes()[1]);
    let (x, y) = (decode(a), decode(b));
    let mut acc = vec![0f64; m * n];
    for i in 0..m {
        let row = &mut acc[i * n..(i + 1) * n];
        for p in 0..k {
            let xv = x[i * k + p];
            for (r, yv) in row.iter_mut().zip(&y[p * n..(p + 1) * n]) {
                *r += xv * yv;
            }
        }
    }
    let mut out = vec![0u8; m * n * dtype.size()];
    for (o, v) in out.chunks_exact_mut(dtype.size()).zip(acc) {
        dtype.encode(v, o);
    }
    out
}

/// A small deterministic generator (splitmix64) for `randn` on the host.
#[derive(Debug, Clone)]
pub(crate) struct HostRng(u64);

impl HostRng {
    pub(crate) fn new(seed: u64) -> HostRng {
        HostRng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform number in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Fills `out` with standard normal numbers (Box-Muller).
    pub(crate) fn fill_normal(&mut self, dtype: DType, out: &mut [u8]) {
        for chunk in out.chunks_exact_mut(dtype.size()) {
            let (u, v) = (self.uniform(), self.uniform());
            let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            dtype.encode(z, chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| DType::F32.decode(c) as f32)
            .collect()
    }

    #[test]
    fn binary_and_scalar_ops() {
        let (a, b) = (f32s(&[1.0, 2.0]), f32s(&[3.0, 4.0]));
        let mut out = vec![0u8; 8];
        elementwise(BinaryOp::Mul, DType::F32, &mut out, &a, Rhs::Each(&b));
        assert_eq!(back(&out), vec![3.0, 8.0]);
        elementwise(
            BinaryOp::Add,
            DType::F32,
            &mut out,
            &a,
            Rhs::<&[u8]>::Scalar(0.5),
        );
        assert_eq!(back(&out), vec![1.5, 2.5]);
    }

    #[test]
    fn matmul_honours_transposed_layouts() {
        let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let la = Layout::contiguous(&[2, 3]);
        let lt = la.transpose(0, 1).expect("2-D");
        let out = matmul(DType::F32, (&a, &la), (&a, &lt));
        assert_eq!(back(&out), vec![14.0, 32.0, 32.0, 77.0]);
    }

    #[test]
    fn normal_numbers_have_unit_spread() {
        let mut out = vec![0u8; 4 * 10_000];
        HostRng::new(7).fill_normal(DType::F32, &mut out);
        let v = back(&out);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.05,
            "mean {mean} var {var}"
        );
    }
}
