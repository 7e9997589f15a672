//! The control plane: a watch-fed cache of the store's facts ([`cache`]),
//! typed snapshots of it ([`view`]), the controller contract
//! ([`controller`]), the pure controllers themselves ([`controllers`]), and
//! the runner that feeds them snapshots and commits their plans with
//! compare-and-swap under a leader lease ([`runner`], [`leader`]).

pub mod cache;
pub mod controller;
pub mod controllers;
pub mod leader;
pub mod metrics;
pub mod netmap;
mod pacing;
pub mod runner;
pub mod view;

pub use cache::Cache;
pub use controller::{Changes, Context, Controller, EventDraft, Plan, Write};
pub use view::{Versioned, View};
