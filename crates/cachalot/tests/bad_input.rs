//! Bad input gets typed errors, never a panic, and never changes state.

use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::config::ConfigError;
use cachalot::error::{FreeError, MAX_REQUEST};
use cachalot::{AllocatorConfig, DeviceAllocator, Error, PolicyKind, PytorchAllocator, StreamId};

fn allocator() -> PytorchAllocator {
    PytorchAllocator::new(Arc::new(SimBackend::h100()), AllocatorConfig::default()).unwrap()
}

#[test]
fn zero_size_is_null_without_stat_change() {
    let a = allocator();
    assert_eq!(a.malloc(0, StreamId(3)).unwrap(), 0);
    assert_eq!(a.stats(), allocator().stats());
    assert_eq!(a.backend().capabilities().total_memory, 85_017_493_504);
}

#[test]
fn one_exbibyte_or_more_is_too_large() {
    let a = allocator();
    for size in [MAX_REQUEST, MAX_REQUEST + 1] {
        match a.malloc(size, StreamId(0)) {
            Err(Error::TooLarge { requested, limit }) => {
                assert_eq!((requested, limit), (size, MAX_REQUEST))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        a.malloc(MAX_REQUEST, StreamId(0)).unwrap_err().to_string(),
        "out of memory: tried to allocate 1152921504606846976 bytes; \
         a request must be under 1152921504606846976 bytes (1 EiB)"
    );
    a.validate().unwrap();
}

#[test]
fn double_and_foreign_frees() {
    let a = allocator();
    let p = a.malloc(100, StreamId(0)).unwrap();
    a.free(p).unwrap();
    let stats = a.stats();
    assert!(matches!(
        a.free(p),
        Err(Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        })
    ));
    assert!(matches!(
        a.free(42),
        Err(Error::InvalidFree {
            reason: FreeError::Foreign,
            ..
        })
    ));
    assert_eq!(a.stats(), stats);
    a.validate().unwrap();
}

#[test]
fn malformed_configs_name_the_key() {
    for (conf, key) in [
        ("max_split_size_mb:abc", "max_split_size_mb"),
        ("expandable_segments:yes", "expandable_segments"),
        (
            "garbage_collection_threshold:2",
            "garbage_collection_threshold",
        ),
        ("roundup_power2_divisions:[1:3]", "roundup_power2_divisions"),
    ] {
        let e = AllocatorConfig::parse(conf).unwrap_err();
        assert!(e.to_string().contains(key), "{conf}: {e}");
    }
    assert_eq!(
        AllocatorConfig::parse("nonsense:1").unwrap_err(),
        ConfigError::UnknownKey("nonsense".into())
    );
    assert!(matches!(
        AllocatorConfig::parse("max_split_size_mb"),
        Err(ConfigError::Syntax(_))
    ));
}

#[test]
fn wrong_policy_and_fraction_are_refused() {
    let backend = Arc::new(SimBackend::h100());
    let mut cfg = AllocatorConfig::default();
    cfg.policy = PolicyKind::Cachalot;
    assert!(matches!(
        PytorchAllocator::new(backend.clone(), cfg.clone()),
        Err(Error::InvalidArgument(_))
    ));
    let alloc = cachalot::allocator::create(backend.clone(), cfg)
        .expect("create builds the cachalot policy");
    assert_eq!(alloc.policy(), PolicyKind::Cachalot);
    for bad in [-0.5, 1.5, f64::NAN] {
        assert!(
            matches!(
                alloc.set_memory_fraction(bad),
                Err(Error::InvalidArgument(_))
            ),
            "{bad}"
        );
        let pytorch = PytorchAllocator::new(backend.clone(), AllocatorConfig::default())
            .expect("default config");
        assert!(
            matches!(
                pytorch.set_memory_fraction(bad),
                Err(Error::InvalidArgument(_))
            ),
            "{bad}"
        );
    }
    let mut cfg = AllocatorConfig::default();
    cfg.per_process_memory_fraction = 1.5;
    assert!(matches!(
        PytorchAllocator::new(backend, cfg),
        Err(Error::InvalidArgument(_))
    ));
}
