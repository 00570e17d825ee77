//! `weir`: see `weir_proxy::cli`.

/// jemalloc instead of glibc's malloc: a proxy allocates and frees small buffers and header
/// maps on every request, and glibc's malloc/free took ~12% of weir's CPU under tiny requests
/// (measured on the earlier pingora plane; see README, "Per-request cost"). mimalloc was as
/// fast but its eagerly committed arena put idle RSS at ~29 MB, over the 20 MB budget.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    weir_proxy::cli::main(std::env::args_os())
}
