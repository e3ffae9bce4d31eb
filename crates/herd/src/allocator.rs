//! The process's allocator and how it hands memory back to the system.
//!
//! mimalloc rather than glibc's malloc: the server makes and drops many
//! small objects from many threads (JSON values, store rows, requests), and
//! under a burst glibc's arenas spent a fifth of its time in malloc and
//! free (consolidating and unlinking chunks); see docs/BENCHMARKS.md.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_t` of
/// mimalloc 3's `mimalloc.h`; libmimalloc-sys gives it no name).
const PURGE_DELAY_OPTION: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory is kept before it is given back to the system.
/// mimalloc's default, 1 s, gave memory back in the middle of a burst that
/// took it again moments later, and each page taken again was a page
/// fault and a zeroed page
/// (on a virtual machine also a fault of the host): a tenth of the
/// server's CPU in a 3,000-member burst. Ten seconds keeps the memory for
/// the burst and still returns it once the burst is over.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// Sets the purge delay, unless the environment (`MIMALLOC_PURGE_DELAY`)
/// set one.
pub fn tune() {
    // SAFETY: sets a plain integer option; mimalloc reads it atomically.
    unsafe { libmimalloc_sys::mi_option_set_default(PURGE_DELAY_OPTION, PURGE_DELAY_MS) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_tuned() {
        // SAFETY: reads a plain integer option.
        let read = || unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY_OPTION) };
        // mimalloc's own default for the purge delay: another option at
        // this place (after a mimalloc upgrade) would read otherwise.
        assert_eq!(read(), 1000, "mi_option_t 15 is not the purge delay");
        tune();
        assert_eq!(read(), PURGE_DELAY_MS);
    }
}
