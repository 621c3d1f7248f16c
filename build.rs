//! Generates the parser from `grammar/est.lalrpop` into OUT_DIR.

fn main() {
    println!("cargo:rerun-if-changed=grammar/est.lalrpop");
    if let Err(e) = lalrpop::Configuration::new()
        .use_cargo_dir_conventions()
        .set_in_dir("grammar")
        .process()
    {
        eprintln!("lalrpop failed: {e}");
        std::process::exit(1);
    }
}
