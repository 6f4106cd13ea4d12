//! An id-addressed arena: values live in a vector and refer to each other by small
//! integer ids instead of pointers. Freed entries are reused, and a stale id
//! fails loudly instead of reaching another value.
//!
//! The pytorch policy's blocks and segments live in one. The cachalot policy's
//! heap keeps its blocks in a plain vector instead: checking the entry at every
//! access, as this arena does, cost that policy 7 to 8% per operation on three
//! of the four bundled traces (`benches/policies.rs`).

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// A typed index into an [`Arena`].
pub(crate) trait ArenaId: Copy + Eq + fmt::Debug {
    /// The id of entry `index`.
    fn from_index(index: usize) -> Self;
    /// The entry this id names.
    fn index(self) -> usize;
}

/// Declares a `u32` id type usable with [`Arena`].
macro_rules! arena_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub(crate) struct $name(u32);

        impl $crate::policy::pytorch::arena::ArenaId for $name {
            fn from_index(index: usize) -> Self {
                $name(u32::try_from(index).expect("an arena never holds more than u32::MAX values"))
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}
pub(crate) use arena_id;

/// Values of type `T` addressed by ids of type `I`.
pub(crate) struct Arena<I, T> {
    entries: Vec<Option<T>>,
    vacant: Vec<usize>,
    live: usize,
    _id: PhantomData<I>,
}

impl<I: ArenaId, T> Default for Arena<I, T> {
    fn default() -> Self {
        Arena {
            entries: Vec::new(),
            vacant: Vec::new(),
            live: 0,
            _id: PhantomData,
        }
    }
}

impl<I: ArenaId, T: fmt::Debug> fmt::Debug for Arena<I, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<I: ArenaId, T> Arena<I, T> {
    /// Stores `value` and returns its id.
    pub(crate) fn insert(&mut self, value: T) -> I {
        self.live += 1;
        match self.vacant.pop() {
            Some(i) => {
                self.entries[i] = Some(value);
                I::from_index(i)
            }
            None => {
                self.entries.push(Some(value));
                I::from_index(self.entries.len() - 1)
            }
        }
    }

    /// Removes and returns the value of `id`, if it is live.
    pub(crate) fn remove(&mut self, id: I) -> Option<T> {
        let value = self.entries.get_mut(id.index())?.take()?;
        self.vacant.push(id.index());
        self.live -= 1;
        Some(value)
    }

    /// The value of `id`, if it is live.
    pub(crate) fn get(&self, id: I) -> Option<&T> {
        self.entries.get(id.index())?.as_ref()
    }

    /// Number of live values.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Every live value with its id, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (I, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((I::from_index(i), v.as_ref()?)))
    }
}

impl<I: ArenaId, T> Index<I> for Arena<I, T> {
    type Output = T;
    fn index(&self, id: I) -> &T {
        match self.entries.get(id.index()) {
            Some(Some(v)) => v,
            _ => panic!("stale arena id {id:?}: an allocator invariant is broken"),
        }
    }
}

impl<I: ArenaId, T> IndexMut<I> for Arena<I, T> {
    fn index_mut(&mut self, id: I) -> &mut T {
        match self.entries.get_mut(id.index()) {
            Some(Some(v)) => v,
            _ => panic!("stale arena id {id:?}: an allocator invariant is broken"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    arena_id!(TestId);

    #[test]
    fn entries_are_reused_and_stale_ids_miss() {
        let mut a: Arena<TestId, &str> = Arena::default();
        let x = a.insert("x");
        let y = a.insert("y");
        assert_eq!(a.remove(x), Some("x"));
        assert_eq!(a.get(x), None);
        assert_eq!(a.remove(x), None);
        let z = a.insert("z");
        assert_eq!(z, x, "freed entry reused");
        assert_eq!(a[y], "y");
        assert_eq!(a.len(), 2);
        assert_eq!(a.iter().count(), 2);
    }
}
