//! The metric names the server records: the product's one catalogue lives in
//! [`ps_core::metric_names`].

pub use ps_core::metric_names::*;
