use std::collections::HashMap;
use std::sync::Arc;
use cachalot::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = &args[1]; let name = &args[2]; let from: usize = args[3].parse().unwrap(); let to: usize = args[4].parse().unwrap();
    let entries = cachalot::golden::load(std::path::Path::new(file)).unwrap();
    let e = entries.iter().find(|e| &e.name == name).unwrap();
    let a = PytorchAllocator::new(Arc::new(backend::sim::SimBackend::h100()), AllocatorConfig::parse(&e.conf).unwrap()).unwrap();
    let mut live = HashMap::new();
    let base = backend::sim::SIM_BASE_ADDRESS;
    for (i, op) in e.ops.as_ref().unwrap().iter().enumerate() {
        match op.0.as_str() { "alloc" => { let p = a.malloc(op.2, StreamId(0)).unwrap(); live.insert(op.1, p); if i>=from && i<=to {println!("op {i} alloc id {} size {} -> {:#x}", op.1, op.2, p-base);} }
          "free" => { let p = live.remove(&op.1).unwrap(); if i>=from && i<=to {println!("op {i} free id {} at {:#x}", op.1, p-base);} a.free(p).unwrap(); }
          _ => { a.empty_cache().unwrap(); if i>=from && i<=to {println!("op {i} empty_cache");} } }
        if i >= from && i <= to {
            for s in a.snapshot().segments { if s.is_small {continue;} print!("  seg {:#x} {}M:", s.address-base, s.total_size>>20); for b in s.blocks { print!(" [{}K {}]", b.size>>10, match b.state { snapshot::BlockState::Inactive => "free", _ => "used"}); } println!(); }
        }
    }
}
