//! Where a node's GPU facts come from: the [`GpuSource`] trait, its two implementations
//! (NVML and the simulator), and [`select_source`], which picks one from the operator's
//! [`SourceChoice`].

use std::fmt;
use std::str::FromStr;

use allot_events::node::{GpuInfo, GpuSourceKind};
use allot_events::telemetry::GpuSample;
use nvml_wrapper::error::NvmlError;

use crate::host::HostCapacity;
use crate::nvml::NvmlSource;
use crate::sim::{SimSpec, SimulatedSource};

/// The GPUs of one node, read from NVML or simulated.
///
/// Calls may block (NVML talks to the driver), so the service runs them on a blocking thread.
pub trait GpuSource: Send {
    /// Which kind of source this is.
    fn kind(&self) -> GpuSourceKind;
    /// Static facts: the driver version and every GPU, by index.
    fn describe(&mut self) -> Result<GpuInventory, SourceError>;
    /// One sample of every GPU, by index.
    fn sample(&mut self) -> Result<Vec<GpuSample>, SourceError>;
    /// For a simulated node, the handle through which the work run on it shows in its samples;
    /// `None` for real GPUs, whose readings are the work's own.
    fn sim_load(&self) -> Option<crate::sim::SimLoad> {
        None
    }
}

/// What [`GpuSource::describe`] reports about a node.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInventory {
    /// NVIDIA driver version, when the source has a driver.
    pub driver_version: Option<String>,
    /// The node's GPUs, by index.
    pub gpus: Vec<GpuInfo>,
    /// CPU and memory the source stands for. `None` means "this machine's own", which the
    /// service reads from the host; a simulated node reports the capacity it simulates.
    pub host: Option<HostCapacity>,
}

/// Why a GPU source could not describe or sample the node.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// NVML could not be loaded or initialised: no driver, no library, or no permission.
    #[error("NVML is unavailable: {reason}")]
    NvmlUnavailable {
        /// What NVML reported.
        reason: String,
    },
    /// A node-wide NVML query failed.
    #[error("NVML could not read the {query}: {source}")]
    Nvml {
        /// What was being read (`device count` …).
        query: &'static str,
        /// NVML's error.
        #[source]
        source: NvmlError,
    },
    /// An NVML query about one GPU failed for a reason other than "not supported".
    #[error("NVML could not read the {query} of GPU {index}: {source}")]
    Gpu {
        /// The GPU's index on the node.
        index: u32,
        /// What was being read (`uuid`, `memory` …).
        query: &'static str,
        /// NVML's error.
        #[source]
        source: NvmlError,
    },
}

/// Which GPU source the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceChoice {
    /// NVML when it initialises, the simulator otherwise.
    #[default]
    Auto,
    /// NVML, or fail: an operator who asks for real GPUs must not silently get simulated ones.
    Nvml,
    /// The simulator, even on a machine with GPUs.
    Simulated,
}

impl SourceChoice {
    /// The accepted spellings, for help texts and errors.
    pub const NAMES: &'static [&'static str] = &["auto", "nvml", "simulated"];
}

impl fmt::Display for SourceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Nvml => "nvml",
            Self::Simulated => "simulated",
        })
    }
}

/// A GPU source name that is not `auto`, `nvml` or `simulated`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU source {0:?}: expected one of auto, nvml, simulated")]
pub struct UnknownSourceChoice(pub String);

impl FromStr for SourceChoice {
    type Err = UnknownSourceChoice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "nvml" => Ok(Self::Nvml),
            "simulated" | "sim" | "simulator" => Ok(Self::Simulated),
            _ => Err(UnknownSourceChoice(s.to_owned())),
        }
    }
}

/// Opens the GPU source the operator chose for `node` and says, in one sentence, which one it
/// is and why (the service logs it).
///
/// `Auto` uses NVML when it initialises and the simulator (described by `sim`) otherwise;
/// `Nvml` fails with [`SourceError::NvmlUnavailable`] rather than fall back.
pub fn select_source(
    choice: SourceChoice,
    node: &str,
    sim: &SimSpec,
) -> Result<(Box<dyn GpuSource>, String), SourceError> {
    let simulated = || -> Box<dyn GpuSource> { Box::new(SimulatedSource::new(node, sim.clone())) };
    match choice {
        SourceChoice::Simulated => Ok((
            simulated(),
            format!(
                "simulator requested; simulating {} × {}",
                sim.gpus, sim.model
            ),
        )),
        SourceChoice::Nvml => {
            let source = NvmlSource::init()?;
            Ok((
                Box::new(source),
                "NVML requested and initialised; using NVML".to_owned(),
            ))
        }
        SourceChoice::Auto => match NvmlSource::init() {
            Ok(source) => Ok((Box::new(source), "NVML initialised; using NVML".to_owned())),
            Err(SourceError::NvmlUnavailable { reason }) => Ok((
                simulated(),
                format!(
                    "NVML unavailable ({reason}); using the simulator ({} × {})",
                    sim.gpus, sim.model
                ),
            )),
            Err(e) => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_choices_parse_case_insensitively_and_reject_the_rest() {
        for (given, want) in [
            ("auto", Some(SourceChoice::Auto)),
            ("NVML", Some(SourceChoice::Nvml)),
            (" simulated ", Some(SourceChoice::Simulated)),
            ("sim", Some(SourceChoice::Simulated)),
            ("gpu", None),
        ] {
            assert_eq!(given.parse::<SourceChoice>().ok(), want, "{given:?}");
        }
        for choice in [
            SourceChoice::Auto,
            SourceChoice::Nvml,
            SourceChoice::Simulated,
        ] {
            assert_eq!(choice.to_string().parse::<SourceChoice>(), Ok(choice));
        }
    }

    #[test]
    fn simulated_choice_never_touches_nvml_and_says_what_it_simulates() {
        let (mut source, why) =
            select_source(SourceChoice::Simulated, "node-1", &SimSpec::default()).unwrap();
        assert_eq!(source.kind(), GpuSourceKind::Simulated);
        assert!(why.contains("simulator requested"), "{why}");
        assert_eq!(
            source.describe().unwrap().gpus.len(),
            SimSpec::default().gpus as usize
        );
    }

    // This machine has no NVIDIA driver, so these two prove the fallback rules; on a GPU node
    // they would pick NVML instead, which is also correct.
    #[test]
    fn auto_falls_back_to_the_simulator_and_says_why_when_nvml_is_missing() {
        let (source, why) =
            select_source(SourceChoice::Auto, "node-1", &SimSpec::default()).unwrap();
        match source.kind() {
            GpuSourceKind::Simulated => {
                assert!(why.starts_with("NVML unavailable ("), "{why}");
                assert!(why.contains("using the simulator"), "{why}");
            }
            GpuSourceKind::Nvml => assert!(why.contains("using NVML"), "{why}"),
        }
    }

    #[test]
    fn explicit_nvml_fails_instead_of_falling_back() {
        match select_source(SourceChoice::Nvml, "node-1", &SimSpec::default()) {
            Ok((source, _)) => assert_eq!(source.kind(), GpuSourceKind::Nvml),
            Err(e) => assert!(
                matches!(e, SourceError::NvmlUnavailable { .. }),
                "unexpected error: {e}"
            ),
        }
    }
}
