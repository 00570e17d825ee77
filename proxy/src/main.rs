//! `weir`: see `weir_proxy::cli`.

fn main() -> std::process::ExitCode {
    weir_proxy::cli::main(std::env::args_os())
}
