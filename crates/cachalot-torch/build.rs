//! Names the shared library by its file name (`DT_SONAME`), so the C++
//! allocator's reference to `libcachalot_torch.so` finds the copy Python loaded
//! first, wherever it lies (`CACHALOT_TORCH_LIB`), and never loads a second one
//! with a registry of its own.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcachalot_torch.so");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
