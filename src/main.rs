//! `estc`, the command-line driver.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
