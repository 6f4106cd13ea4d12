//! The process's tags by name ([`TagBook`]), and its one [`Registry`], created on the first call of any entry
//! point with PyTorch's settings as PyTorch reads them (`PYTORCH_ALLOC_CONF`,
//! else `PYTORCH_CUDA_ALLOC_CONF`) and `CACHALOT_ALLOC_CONF` over them (the
//! same syntax plus `policy:pytorch|cachalot` and the cachalot policy's
//! keys). A configuration that does not parse makes every call fail with the
//! parser's message.

use std::sync::OnceLock;

use cachalot::AllocatorConfig;

use crate::device;
use crate::error::{PluginError, PluginResult};
use crate::registry::Registry;
use crate::sleep::TagBook;

/// The environment variable that configures the plug-in.
pub const CONF_VAR: &str = "CACHALOT_ALLOC_CONF";

/// PyTorch's variables for its allocator's settings, the first one set wins.
pub const PYTORCH_VARS: [&str; 2] = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];

static TAGS: TagBook = TagBook::new();

/// The process's tags by name.
pub(crate) fn tags() -> &'static TagBook {
    &TAGS
}

static REGISTRY: OnceLock<Result<Registry, cachalot::config::ConfigError>> = OnceLock::new();

/// The process's registry, created on first use from [`PYTORCH_VARS`] and
/// [`CONF_VAR`].
pub(crate) fn registry() -> PluginResult<&'static Registry> {
    let made = REGISTRY.get_or_init(|| {
        let pytorch = PYTORCH_VARS
            .iter()
            .find_map(|var| std::env::var(var).ok())
            .unwrap_or_default();
        let conf = std::env::var(CONF_VAR).unwrap_or_default();
        AllocatorConfig::layered(&pytorch, &conf)
            .map(|config| Registry::new(config, Box::new(device::open_cuda)))
    });
    made.as_ref().map_err(|e| PluginError::Config(e.clone()))
}
