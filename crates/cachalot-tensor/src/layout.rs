//! Shapes and strides: how a tensor's elements sit in its storage.

use std::fmt;

/// A tensor's sizes, strides (in elements) and offset into its storage.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    sizes: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    /// A contiguous (row-major) layout of `sizes`.
    pub fn contiguous(sizes: &[usize]) -> Layout {
        let mut strides = vec![0; sizes.len()];
        let mut acc = 1;
        for (stride, &size) in strides.iter_mut().zip(sizes).rev() {
            *stride = acc;
            acc *= size.max(1);
        }
        Layout {
            sizes: sizes.to_vec(),
            strides,
            offset: 0,
        }
    }

    /// The sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The first element's index in the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Whether elements are stored in row-major order without gaps.
    pub fn is_contiguous(&self) -> bool {
        let c = Layout::contiguous(&self.sizes);
        self.sizes
            .iter()
            .zip(self.strides.iter().zip(&c.strides))
            .all(|(&n, (s, cs))| n <= 1 || s == cs)
    }

    /// The same elements with dimensions `a` and `b` swapped (a view).
    /// `None` when either dimension is out of range.
    pub fn transpose(&self, a: usize, b: usize) -> Option<Layout> {
        if a >= self.sizes.len() || b >= self.sizes.len() {
            return None;
        }
        let mut t = self.clone();
        t.sizes.swap(a, b);
        t.strides.swap(a, b);
        Some(t)
    }

    /// The storage index of every element, in row-major order of the sizes.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.numel();
        let mut pos = vec![0usize; self.sizes.len()];
        let mut first = true;
        (0..n).map(move |_| {
            if !first {
                for d in (0..pos.len()).rev() {
                    pos[d] += 1;
                    if pos[d] < self.sizes[d] {
                        break;
                    }
                    pos[d] = 0;
                }
            }
            first = false;
            self.offset
                + pos
                    .iter()
                    .zip(&self.strides)
                    .map(|(p, s)| p * s)
                    .sum::<usize>()
        })
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} strides {:?}", self.sizes, self.strides)?;
        if self.offset != 0 {
            write!(f, " offset {}", self.offset)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_and_transpose() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides(), &[12, 4, 1]);
        assert!(l.is_contiguous());
        let t = l.transpose(0, 2).expect("dims in range");
        assert_eq!(t.sizes(), &[4, 3, 2]);
        assert!(!t.is_contiguous());
        assert!(l.transpose(0, 3).is_none());
    }

    #[test]
    fn indices_walk_a_transposed_view() {
        let t = Layout::contiguous(&[2, 3])
            .transpose(0, 1)
            .expect("dims in range");
        let idx: Vec<usize> = t.indices().collect();
        assert_eq!(idx, vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(Layout::contiguous(&[0, 5]).indices().count(), 0);
    }
}
