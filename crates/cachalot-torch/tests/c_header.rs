//! The C header of the library (`python/cachalot_torch/csrc/cachalot_ffi.h`,
//! included by the C++ allocator) is what cbindgen generates from this
//! crate's exported functions and `#[repr(C)]` rows: one source for the ABI.
//! A change to an exported function or row fails here until the header is
//! written again: `CACHALOT_BLESS=1 cargo test -p cachalot-torch --test c_header`.

use std::path::Path;

#[test]
fn the_checked_in_c_header_is_the_generated_one() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("the crate's C ABI generates");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8");
    let header = crate_dir.join("../../python/cachalot_torch/csrc/cachalot_ffi.h");
    if std::env::var_os("CACHALOT_BLESS").is_some() {
        std::fs::write(&header, &generated).expect("writes the header");
    }
    let checked_in = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is not what the crate generates: run `CACHALOT_BLESS=1 cargo test -p cachalot-torch --test c_header`\n--- generated:\n{generated}",
        header.display()
    );
}
