//! Causeway's own commands, under the `CW.` prefix: consistency levels,
//! sessions carried across connections, and the cluster's layout and state
//! for clients, tests and operators.

pub mod chain;
pub mod cluster;
pub mod consistency;
pub mod digest;
pub mod dr;
pub mod keyrange;
pub mod session;
pub mod sites;
pub mod status;
pub mod with;
