//! `weir`: see `weir_proxy::cli`.

/// jemalloc instead of glibc's malloc: a proxy allocates and frees small buffers and header
/// maps on every request, and glibc's malloc/free took ~12% of weir's CPU under tiny requests
/// (measured on the earlier pingora plane; see README, "Per-request cost"). mimalloc was as
/// fast but its eagerly committed arena put idle RSS at ~29 MB, over the 20 MB budget.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (defining this symbol is how a program sets them;
/// `_RJEM_MALLOC_CONF` in the environment still overrides). Each HTTP/1.1 message makes hyper
/// take a fresh 8 KiB read buffer (the last message's header values still point into the old
/// one), and a burst of 32 connections swings the 8 KiB buffers in use by more than the
/// thread cache's default 20 slots: every request then went through jemalloc's arena (fill,
/// flush, a slab made and freed), ~10% of weir's instructions per request. 128 slots per
/// small size class hold a burst; at most 1 MiB of 8 KiB buffers stays cached.
#[allow(unsafe_code)]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Option<&std::ffi::c_char> =
    Some(unsafe { &*c"tcache_nslots_small_min:128".as_ptr() });

fn main() -> std::process::ExitCode {
    weir_proxy::cli::main(std::env::args_os())
}
