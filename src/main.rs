//! `estc`, the command-line driver.

mod cli;

fn main() {
    // Like other Unix tools, end quietly when the reader of our output goes away
    // (`estc explain E0801 | head`) instead of failing to print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE at start-up, before any
    // thread exists, is what a C program's runtime does.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    est::runtime::keep_freed_memory();
    std::process::exit(cli::main());
}
