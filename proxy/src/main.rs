//! `weir`: see `weir_proxy::cli`.

/// mimalloc instead of glibc's malloc: pingora allocates and frees a few dozen small
/// buffers per request, and glibc's malloc/free took ~12% of weir's CPU under tiny requests
/// (see README, "Per-request cost").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    weir_proxy::cli::main(std::env::args_os())
}
