//! Geo-replication (Eunomia): several sites, each taking writes, each
//! showing the others' writes without ever showing an effect before its
//! cause.
//!
//! * `reporter`: a partition's outgoing streams (ids to its site's
//!   stabilizer replicas, values to the other sites' receivers).
//! * `stabilizer`: the site stabilizer, which orders the site's update ids
//!   by timestamp once stable and ships them to the other sites.
//! * `receiver`: applies other sites' updates once their dependencies are
//!   stable here.

pub mod receiver;
pub mod reporter;
pub mod stabilizer;
