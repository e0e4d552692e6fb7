//! XIDs by meaning. The NVIDIA driver logs an XID — a numbered GPU error — for faults as
//! different as an application's out-of-bounds access (13) and a GPU gone from the PCIe bus
//! (79). NVIDIA's Xid Catalog gives each code a *resolution bucket*, the immediate action that
//! gets the system back into service; [`XID_CLASSES`] holds that bucket for the codes Allot
//! knows, and [`XidClass::remedy`] says what remediation does about each bucket.
//!
//! Source: the Xid Catalog, "Resolution Bucket (Immediate Action)" column,
//! <https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>, as stored without a
//! date; its newest rows are annotated "CUDA 12.9; GPU driver R575", so this is the R575-era
//! revision. Every code was also checked against the bucket NVIDIA's NVSentinel
//! (`xiderrorsmapping.csv`) assigns it. Left out on purpose, so they take the unknown-code path
//! (alert only): codes the catalog marks "Unused" on A100 and later; codes where the two
//! sources disagree (108, 142, 160); codes the catalog gives no bucket (162 and up).
//! `tests/xid-catalog.csv` is the extract, and `tests/xid_catalog.rs` holds this table to it.

use crate::engine::{Audience, Request};
use crate::rules::Action;

/// The rule name on every verdict an XID decides.
pub const XID_RULE: &str = "xid";

/// An XID's resolution bucket in NVIDIA's Xid Catalog (its immediate action).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XidClass {
    /// `RESTART_APP`: the application must restart; neither the GPU nor the node needs a
    /// reset. An application fault (13, 31) or one contained to one application (94).
    RestartApp,
    /// `IGNORE`: no action required; the GPU stays healthy (43: an application hit a software
    /// fault and was terminated; 63: a row was remapped).
    Ignore,
    /// `RESET_GPU`: the GPU must be reset before it is used again (95, 119, 120, …).
    ResetGpu,
    /// `RESTART_BM`: restart the bare-metal node (79: the GPU has fallen off the bus).
    RestartBareMetal,
    /// `RESTART_VM`: restart the VM that owns the GPU (151).
    RestartVm,
    /// `WORKFLOW_XID_45`: alone, restart the fabric manager; with other XIDs, follow those.
    Xid45Workflow,
    /// `WORKFLOW_XID_48`: a double-bit ECC error — alone, reset the GPU; with 63 or 64, drain
    /// and reset it. Either way the GPU is reset.
    Xid48Workflow,
    /// `WORKFLOW_NVLINK_ERR`: decode the NVLink error registers in the message (74).
    NvlinkWorkflow,
    /// `WORKFLOW_NVLINK5_ERR`: decode the fifth-generation NVLink message (144–150).
    Nvlink5Workflow,
    /// `CHECK_MECHANICALS`: check the GPU's seating and connections (54).
    CheckMechanicals,
    /// `UPDATE_SWFW`: update firmware and software (78).
    UpdateSwFw,
    /// `CHECK_UVM`: reset the GPU if UVM or vGPU is in use, otherwise ignore (159).
    CheckUvm,
    /// `XID_154`: follow the recovery action that XID 154's own message names.
    Xid154,
    /// `CONTACT_SUPPORT`. No code in the table has it: the catalog gives it only to codes unused
    /// on A100 and later, and to 142, where NVSentinel disagrees.
    ContactSupport,
}

/// What remediation does about an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remedy {
    /// What is taken out of service, if anything ([`Action::Alert`]: nothing).
    pub action: Action,
    /// Who must hear of it.
    pub audience: Audience,
    /// What an external actuator is asked to do.
    pub request: Option<Request>,
}

impl Remedy {
    const fn alert(audience: Audience) -> Self {
        Self {
            action: Action::Alert,
            audience,
            request: None,
        }
    }
}

impl XidClass {
    /// The bucket's name as the catalog spells it.
    pub fn bucket(self) -> &'static str {
        match self {
            Self::RestartApp => "RESTART_APP",
            Self::Ignore => "IGNORE",
            Self::ResetGpu => "RESET_GPU",
            Self::RestartBareMetal => "RESTART_BM",
            Self::RestartVm => "RESTART_VM",
            Self::Xid45Workflow => "WORKFLOW_XID_45",
            Self::Xid48Workflow => "WORKFLOW_XID_48",
            Self::NvlinkWorkflow => "WORKFLOW_NVLINK_ERR",
            Self::Nvlink5Workflow => "WORKFLOW_NVLINK5_ERR",
            Self::CheckMechanicals => "CHECK_MECHANICALS",
            Self::UpdateSwFw => "UPDATE_SWFW",
            Self::CheckUvm => "CHECK_UVM",
            Self::Xid154 => "XID_154",
            Self::ContactSupport => "CONTACT_SUPPORT",
        }
    }

    /// What remediation does about an XID of this class.
    ///
    /// - Application faults ([`RestartApp`](Self::RestartApp)) and
    ///   [`Ignore`](Self::Ignore): tell the team whose task is on that GPU; touch no GPU and
    ///   no node. The catalog files 43 (an application's own fault, GPU healthy) under
    ///   `IGNORE`, not `RESTART_APP`, so both go to the team.
    /// - [`ResetGpu`](Self::ResetGpu) and [`Xid48Workflow`](Self::Xid48Workflow): take that one
    ///   GPU out of service and ask for it to be reset.
    /// - [`RestartBareMetal`](Self::RestartBareMetal): drain the node and ask for it to be
    ///   rebooted.
    /// - Every other class needs something Allot cannot tell from the code alone (decoding
    ///   registers, knowing whether UVM is in use, a person at the rack): an alert to the
    ///   operators, no capacity taken.
    pub fn remedy(self) -> Remedy {
        match self {
            Self::RestartApp | Self::Ignore => Remedy::alert(Audience::Team),
            Self::ResetGpu | Self::Xid48Workflow => Remedy {
                action: Action::GpuOutOfService,
                audience: Audience::Operators,
                request: Some(Request::ResetGpu),
            },
            Self::RestartBareMetal => Remedy {
                action: Action::Drain,
                audience: Audience::Operators,
                request: Some(Request::RebootNode),
            },
            Self::RestartVm
            | Self::Xid45Workflow
            | Self::NvlinkWorkflow
            | Self::Nvlink5Workflow
            | Self::CheckMechanicals
            | Self::UpdateSwFw
            | Self::CheckUvm
            | Self::Xid154
            | Self::ContactSupport => Remedy::alert(Audience::Operators),
        }
    }
}

/// The catalog's class of `code`, if the table has it.
pub fn class(code: u64) -> Option<XidClass> {
    XID_CLASSES
        .binary_search_by_key(&code, |(c, _)| *c)
        .ok()
        .map(|i| XID_CLASSES[i].1)
}

/// What remediation does about `code`: its class's remedy, and for a code not in the table an
/// alert to the operators and nothing taken — an unknown code never costs capacity.
pub fn remedy(code: u64) -> Remedy {
    class(code).map_or(Remedy::alert(Audience::Operators), XidClass::remedy)
}

use XidClass::{
    CheckMechanicals, CheckUvm, Ignore, Nvlink5Workflow, NvlinkWorkflow, ResetGpu, RestartApp,
    RestartBareMetal, RestartVm, UpdateSwFw, Xid45Workflow, Xid48Workflow, Xid154,
};

/// Each code Allot knows with its catalog class, in ascending code order (see the module
/// docs for the source and for what is left out).
pub const XID_CLASSES: &[(u64, XidClass)] = &[
    (8, RestartApp),
    (11, RestartApp),
    (13, RestartApp),
    (14, Ignore),
    (25, RestartApp),
    (31, RestartApp),
    (32, RestartApp),
    (37, Ignore),
    (38, Ignore),
    (39, RestartApp),
    (40, RestartApp),
    (41, RestartApp),
    (43, Ignore),
    (44, Ignore),
    (45, Xid45Workflow),
    (46, ResetGpu),
    (48, Xid48Workflow),
    (54, CheckMechanicals),
    (60, RestartApp),
    (62, ResetGpu),
    (63, Ignore),
    (64, ResetGpu),
    (66, Ignore),
    (67, Ignore),
    (68, RestartApp),
    (69, RestartApp),
    (70, RestartApp),
    (71, RestartApp),
    (72, RestartApp),
    (74, NvlinkWorkflow),
    (75, RestartApp),
    (76, RestartApp),
    (77, RestartApp),
    (78, UpdateSwFw),
    (79, RestartBareMetal),
    (80, RestartApp),
    (82, RestartApp),
    (83, RestartApp),
    (84, RestartApp),
    (85, RestartApp),
    (86, RestartApp),
    (88, RestartApp),
    (89, RestartApp),
    (92, Ignore),
    (93, Ignore),
    (94, RestartApp),
    (95, ResetGpu),
    (96, RestartApp),
    (97, RestartApp),
    (98, RestartApp),
    (99, RestartApp),
    (100, RestartApp),
    (101, RestartApp),
    (102, RestartApp),
    (103, RestartApp),
    (104, RestartApp),
    (105, RestartApp),
    (106, Ignore),
    (107, Ignore),
    (109, ResetGpu),
    (110, ResetGpu),
    (119, ResetGpu),
    (120, ResetGpu),
    (121, Ignore),
    (126, RestartApp),
    (127, RestartApp),
    (128, RestartApp),
    (129, RestartApp),
    (130, RestartApp),
    (131, RestartApp),
    (132, RestartApp),
    (133, RestartApp),
    (134, RestartApp),
    (135, RestartApp),
    (136, ResetGpu),
    (137, Ignore),
    (139, RestartApp),
    (140, ResetGpu),
    (141, Ignore),
    (143, ResetGpu),
    (144, Nvlink5Workflow),
    (145, Nvlink5Workflow),
    (146, Nvlink5Workflow),
    (147, Nvlink5Workflow),
    (148, Nvlink5Workflow),
    (149, Nvlink5Workflow),
    (150, Nvlink5Workflow),
    (151, RestartVm),
    (152, Ignore),
    (153, Ignore),
    (154, Xid154),
    (155, ResetGpu),
    (156, ResetGpu),
    (157, Ignore),
    (158, ResetGpu),
    (159, CheckUvm),
    (161, Ignore),
];
