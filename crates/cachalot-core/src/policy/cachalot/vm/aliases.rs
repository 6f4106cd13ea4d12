//! The mappings a moved page leaves behind.
//!
//! The driver can map one physical handle at several addresses at once. When
//! a stream re-maps a cached page of one cell (its *owner*) under another
//! cell, it maps the handle at the new cell and leaves the old mapping in
//! place instead of unmapping it: the old cell becomes an **alias** of the
//! handle. To the pool an alias is an unmapped cell (no block lies on it, it
//! counts in no statistic); to the driver it is still mapped, so:
//!
//! * re-mapping a page costs one call (map) instead of two (unmap, map);
//! * a block that comes back to an alias whose handle is cached at its owner
//!   takes the handle back with no call at all (the handle *moves*: its owner
//!   becomes an alias in turn), which is how a layout that keeps changing
//!   (bert_dynamic) revisits the addresses it used before;
//! * an alias is unmapped only when another handle must be mapped over it, or
//!   when its handle is unmapped from its owner (before the handle goes back
//!   to the device, which frees memory only once no mapping is left).
//!
//! Only one-page handles move this way, and only within one pool's range.
//!
//! Invariants (checked by [`Aliases::check`]): an alias cell holds no page
//! of its own, and each aliased handle's owner maps it, one page long.
//!
//! Bookkeeping only: the caller makes the backend calls and reports them here.

use std::collections::HashMap;

use crate::backend::PageHandle;

use super::cells::Cells;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    /// The handle each alias cell still maps.
    at: HashMap<u32, PageHandle>,
    /// Each aliased handle's owner cell and alias cells.
    of: HashMap<PageHandle, (u32, Vec<u32>)>,
}

impl Aliases {
    /// The handle an alias at `cell` maps, if it is one.
    pub(crate) fn at(&self, cell: u32) -> Option<PageHandle> {
        self.at.get(&cell).copied()
    }

    /// Whether any cell of `cells` is an alias.
    pub(crate) fn any_in(&self, cells: std::ops::Range<u32>) -> bool {
        !self.at.is_empty() && cells.into_iter().any(|c| self.at.contains_key(&c))
    }

    /// One alias cell of `handle`, if it has any.
    pub(crate) fn first_of(&self, handle: PageHandle) -> Option<u32> {
        self.of
            .get(&handle)
            .and_then(|(_, cells)| cells.first().copied())
    }

    /// The owner of `handle`, when it has aliases.
    pub(crate) fn owner(&self, handle: PageHandle) -> Option<u32> {
        self.of.get(&handle).map(|(owner, _)| *owner)
    }

    /// Records that `handle` left `from` (which still maps it) for `to`.
    pub(crate) fn moved(&mut self, handle: PageHandle, from: u32, to: u32) {
        debug_assert!(!self.at.contains_key(&from), "an alias owned a page");
        self.at.insert(from, handle);
        let entry = self.of.entry(handle).or_insert((to, Vec::new()));
        entry.0 = to;
        entry.1.push(from);
        // A handle moving back to one of its aliases leaves that alias.
        if self.at.get(&to) == Some(&handle) {
            self.forget(to);
        }
    }

    /// Forgets the alias at `cell` (once unmapped): its handle.
    pub(crate) fn forget(&mut self, cell: u32) -> Option<PageHandle> {
        let handle = self.at.remove(&cell)?;
        if let Some((_, cells)) = self.of.get_mut(&handle) {
            cells.retain(|c| *c != cell);
            if cells.is_empty() {
                self.of.remove(&handle);
            }
        }
        Some(handle)
    }

    /// Checks the invariants against the pool's cells.
    pub(crate) fn check(&self, cells: &Cells) -> Result<(), String> {
        let listed: usize = self.of.values().map(|(_, c)| c.len()).sum();
        if listed != self.at.len() {
            return Err(format!(
                "{} alias cells, {listed} listed by handle",
                self.at.len()
            ));
        }
        for (handle, (owner, aliases)) in &self.of {
            if cells.page(*owner) != Some(*handle)
                || cells.extent(*owner) != Some(*owner..owner + 1)
            {
                return Err(format!(
                    "aliased handle {} is not mapped alone at its owner cell {owner}",
                    handle.0
                ));
            }
            for c in aliases {
                if self.at.get(c) != Some(handle) || cells.is_mapped(*c) {
                    return Err(format!("alias cell {c} of handle {} is mapped", handle.0));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_moving_about_keeps_its_aliases_listed() {
        let (h, k) = (PageHandle(7), PageHandle(8));
        let mut a = Aliases::default();
        a.moved(h, 0, 3);
        a.moved(h, 3, 5);
        // Another handle mapped over an alias: the alias went first.
        assert_eq!(a.forget(0), Some(h));
        a.moved(k, 1, 0);
        assert_eq!((a.at(0), a.at(3), a.at(1)), (None, Some(h), Some(k)));
        assert_eq!(a.owner(h), Some(5));
        assert!(a.any_in(2..4) && !a.any_in(4..6));
        // Moving back to an alias leaves that alias.
        a.moved(h, 5, 3);
        assert_eq!((a.at(3), a.at(5), a.owner(h)), (None, Some(h), Some(3)));
        assert_eq!(a.forget(5), Some(h));
        assert_eq!((a.first_of(h), a.owner(h)), (None, None));
        assert_eq!(a.first_of(k), Some(1));
    }

    #[test]
    fn check_finds_an_alias_over_a_mapped_cell() {
        let g = 2 << 20;
        let mut cells = Cells::new(1 << 40, g);
        cells.install(0, 1, PageHandle(1));
        cells.install(1, 1, PageHandle(2));
        let mut a = Aliases::default();
        a.moved(PageHandle(1), 4, 0);
        a.check(&cells).unwrap();
        a.moved(PageHandle(2), 0, 1);
        let err = a.check(&cells).unwrap_err();
        assert!(err.contains("alias cell 0"), "{err}");
    }
}
