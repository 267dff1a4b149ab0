//! CubeCL's on-disk kernel cache for the GPU backends (issue 20).
//!
//! burn's CubeCL backends compile each kernel (the lab's attention kernels, burn's element-wise,
//! reduction, matmul and — with `fusion` — fused kernels) the first time a process launches it,
//! and with `autotune` (both part of the `cuda` feature) they benchmark candidate kernels for
//! every new shape key. A sweep starts one `lab run-one` process per run, so without a cache on
//! disk every run pays for all of it again. On the H200 (2026-12-04, docs/performance.md) a
//! quick-preset training step did not finish within 60 s and four block-width runs sharing the GPU
//! finished none of their 300 steps in 45 s. On lavapipe, with the `cuda` feature set built for
//! `wgpu` (fusion, autotune), the first step of `lab bench train-step --preset quick --backend
//! wgpu` takes 70 s against 1.9 s for the next ones, and 21 s when this cache is warm (Mesa's own
//! shader cache off; 7–8 s with it: docs/performance.md, "The kernel cache").
//!
//! With the cargo feature `kernel-cache` (part of `cuda`), CubeCL's `persistence` keeps compiled
//! kernels (PTX on CUDA, SPIR-V on wgpu) and autotune decisions in a database in CubeCL's
//! environment directory: `target/environment` of the outermost Cargo workspace above the working
//! directory, else the user cache directory (`~/.cache/cubecl`). CubeCL keys every kernel by the
//! binary's build id, so a rebuilt `lab` never loads a kernel compiled from older code, and
//! tolerates several processes sharing one database (a refused write costs a recompile).
//!
//! [`configure`] reads CubeCL's configuration as CubeCL would (a `cubecl.toml` from the working
//! directory up, then CubeCL's environment variables such as `CUBECL_AUTOTUNE_LEVEL`) and applies
//! `LAB_KERNEL_CACHE` ([`CacheSetting`]): CubeCL leaves the kernel half of the cache off by
//! default, the lab turns it on.

/// What `LAB_KERNEL_CACHE` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheSetting {
    /// Unset, empty or `on`: kernels and autotune decisions cached in CubeCL's environment
    /// directory (module docs), or where a `cubecl.toml` puts it.
    On,
    /// `off`: no kernel or autotune decision read from or written to disk; each process compiles
    /// and tunes afresh.
    Off,
    /// An absolute path: the cache in that directory (created on first use). It is a database
    /// with a write-ahead log (`default.db`, `-wal`, `-tshm` files), so keep it on a local disk
    /// (a node's scratch on a cluster), not a network file system.
    Directory(std::path::PathBuf),
}

impl CacheSetting {
    /// Parse the value of `LAB_KERNEL_CACHE` (`None` when unset).
    ///
    /// # Errors
    /// Anything but `on`, `off` or an absolute path: one line naming the variable and the values
    /// allowed.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.map(str::trim) {
            None | Some("") | Some("on") => Ok(CacheSetting::On),
            Some("off") => Ok(CacheSetting::Off),
            Some(path) if std::path::Path::new(path).is_absolute() => {
                Ok(CacheSetting::Directory(path.into()))
            }
            Some(other) => Err(format!(
                "LAB_KERNEL_CACHE = `{other}`: allowed values are on (the default), off, or an absolute directory path"
            )),
        }
    }
}

/// Install CubeCL's configuration for this process with the kernel cache as `LAB_KERNEL_CACHE`
/// says ([`CacheSetting`]); call before the first CubeCL device is made (`Backend::device` does).
/// Later calls, and calls after CubeCL has read its configuration, change nothing. In a build
/// without the `kernel-cache` feature only the variable's value is checked.
///
/// # Errors
/// A `LAB_KERNEL_CACHE` value that [`CacheSetting::parse`] refuses.
pub fn configure() -> Result<(), String> {
    let setting = CacheSetting::parse(std::env::var("LAB_KERNEL_CACHE").ok().as_deref())?;
    #[cfg(feature = "kernel-cache")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| install(setting));
    }
    #[cfg(not(feature = "kernel-cache"))]
    let _ = setting;
    Ok(())
}

#[cfg(feature = "kernel-cache")]
fn install(setting: CacheSetting) {
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    match setting {
        CacheSetting::On => config.compilation.cache = true,
        CacheSetting::Off => {
            config.compilation.cache = false;
            config.autotune.disable_cache = true;
        }
        CacheSetting::Directory(dir) => {
            config.compilation.cache = true;
            config.environment.path = cubecl::config::cache::CacheConfig::Directory(dir);
        }
    }
    // `false` when CubeCL already holds a configuration (set by a caller or read by a kernel
    // launched before): that one stays.
    let _ = CubeClRuntimeConfig::try_set(config);
}

#[cfg(test)]
mod tests {
    use super::CacheSetting;

    #[test]
    fn parse_lab_kernel_cache() {
        assert_eq!(CacheSetting::parse(None), Ok(CacheSetting::On));
        assert_eq!(CacheSetting::parse(Some("")), Ok(CacheSetting::On));
        assert_eq!(CacheSetting::parse(Some("on")), Ok(CacheSetting::On));
        assert_eq!(CacheSetting::parse(Some(" off ")), Ok(CacheSetting::Off));
        assert_eq!(
            CacheSetting::parse(Some("/scratch/kernels")),
            Ok(CacheSetting::Directory("/scratch/kernels".into()))
        );
        let err = CacheSetting::parse(Some("kernels")).unwrap_err();
        assert!(err.starts_with("LAB_KERNEL_CACHE = `kernels`"), "{err}");
        assert!(CacheSetting::parse(Some("yes")).is_err());
    }
}
