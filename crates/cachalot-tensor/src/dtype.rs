//! Element types: [`DType`] and the host types that carry them ([`Element`]).

use std::fmt;

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float (`torch.float32`).
    F32,
    /// 16-bit IEEE float (`torch.float16`).
    F16,
    /// 16-bit brain float (`torch.bfloat16`).
    BF16,
    /// 64-bit float (`torch.float64`).
    F64,
    /// 64-bit signed integer (`torch.int64`).
    I64,
    /// 32-bit signed integer (`torch.int32`).
    I32,
    /// 8-bit unsigned integer (`torch.uint8`).
    U8,
    /// Boolean, one byte per element (`torch.bool`).
    Bool,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// PyTorch's name (`float32`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// Encodes `value` as one element of this type, in native byte order, into `out`
    /// (which holds exactly [`DType::size`] bytes). Integers saturate; bool is `value != 0`.
    pub(crate) fn encode(self, value: f64, out: &mut [u8]) {
        match self {
            DType::F32 => out.copy_from_slice(&(value as f32).to_ne_bytes()),
            DType::F16 => out.copy_from_slice(&f16::from_f64(value).to_ne_bytes()),
            DType::BF16 => out.copy_from_slice(&bf16::from_f64(value).to_ne_bytes()),
            DType::F64 => out.copy_from_slice(&value.to_ne_bytes()),
            DType::I64 => out.copy_from_slice(&(value as i64).to_ne_bytes()),
            DType::I32 => out.copy_from_slice(&(value as i32).to_ne_bytes()),
            DType::U8 => out[0] = value as u8,
            DType::Bool => out[0] = u8::from(value != 0.0),
        }
    }

    /// Decodes one element of this type from `bytes` (exactly [`DType::size`] bytes).
    pub(crate) fn decode(self, bytes: &[u8]) -> f64 {
        fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
            let mut a = [0u8; N];
            a.copy_from_slice(&b[..N]);
            a
        }
        match self {
            DType::F32 => f64::from(f32::from_ne_bytes(arr(bytes))),
            DType::F16 => f16::from_ne_bytes(arr(bytes)).to_f64(),
            DType::BF16 => bf16::from_ne_bytes(arr(bytes)).to_f64(),
            DType::F64 => f64::from_ne_bytes(arr(bytes)),
            DType::I64 => i64::from_ne_bytes(arr(bytes)) as f64,
            DType::I32 => f64::from(i32::from_ne_bytes(arr(bytes))),
            DType::U8 => f64::from(bytes[0]),
            DType::Bool => f64::from(u8::from(bytes[0] != 0)),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.name())
    }
}

/// A host type that holds one element of a [`DType`]: what `from_vec` takes and
/// `to_vec` returns.
pub trait Element: Copy + Send + Sync + fmt::Debug + 'static {
    /// The dtype this type carries.
    const DTYPE: DType;
    /// Appends the element's native-order bytes.
    fn put(self, out: &mut Vec<u8>);
    /// Reads an element from exactly `DTYPE.size()` bytes.
    fn take(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_ne_bytes());
            }
            fn take(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&bytes[..std::mem::size_of::<$t>()]);
                <$t>::from_ne_bytes(a)
            }
        }
    };
}

element!(f32, DType::F32);
element!(f64, DType::F64);
element!(f16, DType::F16);
element!(bf16, DType::BF16);
element!(i64, DType::I64);
element!(i32, DType::I32);
element!(u8, DType::U8);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn put(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn take(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trips_every_dtype() {
        for dt in DType::ALL {
            let mut buf = vec![0u8; dt.size()];
            dt.encode(3.0, &mut buf);
            let expect = if dt == DType::Bool { 1.0 } else { 3.0 };
            assert_eq!(dt.decode(&buf), expect, "{dt}");
        }
        let mut b = [0u8; 2];
        DType::BF16.encode(1.0 / 3.0, &mut b);
        assert!((DType::BF16.decode(&b) - 1.0 / 3.0).abs() < 1e-2);
    }

    #[test]
    fn elements_match_their_dtype_sizes() {
        let mut v = Vec::new();
        1.5f32.put(&mut v);
        (-7i64).put(&mut v);
        true.put(&mut v);
        assert_eq!(v.len(), 4 + 8 + 1);
        assert_eq!(f32::take(&v[0..4]), 1.5);
        assert_eq!(i64::take(&v[4..12]), -7);
        assert!(bool::take(&v[12..]));
        assert_eq!(DType::BF16.to_string(), "torch.bfloat16");
    }
}
