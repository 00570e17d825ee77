//! The live priority table: one `ArcSwap` holding one immutable compiled snapshot.
//!
//! Readers (`load`) never lock: the request path sees either the old or the new table,
//! never a mix. Writers serialise on a mutex so that "check If-Match, validate, persist,
//! swap" is one atomic step: of two racing writers with the same If-Match exactly one wins.

use std::sync::{Arc, Mutex};

use admission_core::table::{CompiledTable, PriorityTable, TableErrors};
use arc_swap::{ArcSwap, Guard};

pub struct TableStore {
    current: ArcSwap<CompiledTable>,
    /// Held across check + persist + swap.
    commit: Mutex<()>,
}

/// Why a swap did not happen; the current table is untouched in every case.
#[derive(Debug)]
pub enum SwapError<E> {
    /// `if_version` did not name the current version.
    VersionMismatch {
        expected: u64,
        current: u64,
    },
    Invalid(TableErrors),
    /// The persist step failed.
    Persist(E),
}

// === impl TableStore ===

impl TableStore {
    pub fn new(initial: CompiledTable) -> Arc<Self> {
        Arc::new(TableStore { current: ArcSwap::from_pointee(initial), commit: Mutex::new(()) })
    }

    /// The current table; lock-free, for the request path. Keep the guard short-lived.
    #[inline]
    pub fn load(&self) -> Guard<Arc<CompiledTable>> {
        self.current.load()
    }

    /// The current table as an owned `Arc`, for holders that outlive a request.
    pub fn load_full(&self) -> Arc<CompiledTable> {
        self.current.load_full()
    }

    pub fn version(&self) -> u64 {
        self.current.load().version()
    }

    /// Replaces the table with `next` at version `current + 1`, after checking
    /// `if_version` (when given) and running `persist` on the compiled result. The user-hash
    /// secret carries over. Everything happens under the commit lock; on any error the
    /// current table keeps serving.
    pub fn swap<E>(
        &self,
        mut next: PriorityTable,
        if_version: Option<u64>,
        persist: impl FnOnce(&CompiledTable) -> Result<(), E>,
    ) -> Result<Arc<CompiledTable>, SwapError<E>> {
        // A panic while holding the lock cannot leave a half-swapped table (the swap is
        // one pointer store), so a poisoned lock is safe to reuse.
        let _commit = self.commit.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let current = self.current.load_full();
        if let Some(expected) = if_version {
            if expected != current.version() {
                return Err(SwapError::VersionMismatch { expected, current: current.version() });
            }
        }
        next.version = current.version() + 1;
        let compiled = Arc::new(current.compile_next(&next).map_err(SwapError::Invalid)?);
        persist(&compiled).map_err(SwapError::Persist)?;
        self.current.store(compiled.clone());
        Ok(compiled)
    }
}

impl std::fmt::Debug for TableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableStore").field("current", &*self.load()).finish()
    }
}

#[cfg(test)]
mod tests;
