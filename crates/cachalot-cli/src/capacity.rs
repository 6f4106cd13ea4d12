//! Sizes on the command line, and the simulated device's capacity: what
//! `--capacity` accepts (bytes, or a number with a unit: `80GiB`, `24GB`,
//! `1.5GiB`, `80G`) and the range a replay can simulate, from one page to
//! [`SIM_MAX_CAPACITY`].

use std::num::{IntErrorKind, ParseIntError};

use cachalot::backend::sim::{SIM_GRANULARITY, SIM_MAX_CAPACITY};
use cachalot::error::format_bytes;
use thiserror::Error;

/// Units a size may carry, with their value in bytes (matched without
/// regard to case; a single letter is the binary unit, as `80G` is read
/// by `numfmt --from=iec` and PyTorch users mean it).
const UNITS: [(&str, u64); 13] = [
    ("B", 1),
    ("K", 1 << 10),
    ("M", 1 << 20),
    ("G", 1 << 30),
    ("T", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// A capacity that cannot be simulated, or does not parse.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub(crate) enum CapacityError {
    /// Outside the range the simulated device supports.
    #[error(
        "a device of {device} cannot be simulated: the capacity must be between {} ({} bytes) and {} ({} bytes)",
        describe(SIM_GRANULARITY), SIM_GRANULARITY, describe(SIM_MAX_CAPACITY), SIM_MAX_CAPACITY
    )]
    OutOfRange {
        /// The capacity asked for, as written (`0 bytes`, `512TiB`).
        device: String,
    },
    /// Not a number of bytes, with or without a unit.
    #[error(
        "'{0}' is not a size: expected bytes or a number with a unit (80GiB, 24GB, 1.5GiB, 80G)"
    )]
    Malformed(String),
}

/// `bytes` in the largest binary unit that divides it (`2 MiB`, `256 TiB`).
fn describe(bytes: u64) -> String {
    UNITS
        .iter()
        .rev()
        .find(|(name, unit)| {
            name.len() > 1 && unit.is_power_of_two() && bytes.is_multiple_of(*unit)
        })
        .map_or_else(
            || format_bytes(bytes),
            |(name, unit)| format!("{} {name}", bytes / unit),
        )
}

/// Checks that a device of `bytes` can be simulated.
///
/// # Errors
/// [`CapacityError::OutOfRange`].
pub(crate) fn check(bytes: u64) -> Result<u64, CapacityError> {
    in_range(bytes, || format!("{bytes} bytes"))
}

/// `bytes` when a device of that size can be simulated; else the error naming
/// the `device` asked for.
fn in_range(bytes: u64, device: impl FnOnce() -> String) -> Result<u64, CapacityError> {
    if (SIM_GRANULARITY..=SIM_MAX_CAPACITY).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(CapacityError::OutOfRange { device: device() })
    }
}

/// Parses a `--capacity` value and checks its range.
///
/// # Errors
/// [`CapacityError`].
pub(crate) fn parse(text: &str) -> Result<u64, CapacityError> {
    let bytes = size(text)?;
    in_range(bytes, || match text.trim().parse::<u64>() {
        Ok(n) => format!("{n} bytes"),
        Err(_) => text.trim().to_string(),
    })
}

/// Parses a size: bytes, or a number (decimals allowed) with a unit of
/// [`UNITS`], rounded to the nearest byte.
///
/// # Errors
/// [`CapacityError::Malformed`], or [`CapacityError::OutOfRange`] past
/// `u64::MAX` bytes.
pub(crate) fn size(text: &str) -> Result<u64, CapacityError> {
    let malformed = || CapacityError::Malformed(text.to_string());
    let trimmed = text.trim();
    let end = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(end);
    let unit = unit.trim();
    let scale = match unit {
        "" => 1,
        _ => UNITS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(unit))
            .map(|(_, scale)| *scale)
            .ok_or_else(malformed)?,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.len() > 18 || fraction.contains('.') {
        return Err(malformed());
    }
    let out_of_range = || CapacityError::OutOfRange {
        device: trimmed.to_string(),
    };
    let whole: u128 = match whole {
        "" => 0,
        w => w.parse().map_err(|e: ParseIntError| {
            if *e.kind() == IntErrorKind::PosOverflow {
                out_of_range()
            } else {
                malformed()
            }
        })?,
    };
    let denominator = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = match fraction {
        "" => 0,
        f => f.parse().map_err(|_| malformed())?,
    };
    let bytes = whole
        .checked_mul(denominator)
        .and_then(|n| n.checked_add(fraction))
        .and_then(|n| n.checked_mul(u128::from(scale)))
        .map(|n| (n + denominator / 2) / denominator)
        .ok_or_else(out_of_range)?;
    u64::try_from(bytes).map_err(|_| out_of_range())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse("80GiB"), Ok(80 << 30));
        assert_eq!(parse("24GB"), Ok(24_000_000_000));
        assert_eq!(parse("512 MiB"), Ok(512 << 20));
        assert_eq!(parse("2097152"), Ok(2 << 20));
        assert_eq!(parse("256TiB"), Ok(1 << 48));
        assert_eq!(parse("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse("80G"), Ok(80 << 30));
        assert_eq!(parse("80gib"), Ok(80 << 30));
        assert_eq!(parse(".5 TiB"), Ok(1 << 39));
        assert_eq!(size("2.0000001KB"), Ok(2000));
        for bad in ["1.2.3GiB", ".GiB", "1,5GiB", "5 GiBs"] {
            assert!(
                matches!(parse(bad), Err(CapacityError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse("12 parsecs"),
            Err(CapacityError::Malformed(_))
        ));
        assert!(matches!(parse("GiB"), Err(CapacityError::Malformed(_))));
        assert!(matches!(parse("-5"), Err(CapacityError::Malformed(_))));
    }

    #[test]
    fn the_range_is_one_page_to_256_tib() {
        for refused in ["0", "2097151", "281474976710657", "18446744073709551615"] {
            assert!(
                matches!(parse(refused), Err(CapacityError::OutOfRange { .. })),
                "{refused}"
            );
        }
        let huge = parse("99999999999999999999999TiB").unwrap_err();
        assert!(matches!(huge, CapacityError::OutOfRange { .. }), "{huge}");
        let message = check(0).unwrap_err().to_string();
        assert_eq!(
            message,
            "a device of 0 bytes cannot be simulated: the capacity must be between \
             2 MiB (2097152 bytes) and 256 TiB (281474976710656 bytes)"
        );
    }
}
