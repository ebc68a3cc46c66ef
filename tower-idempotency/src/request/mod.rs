//! The request path.

pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod inline;
pub(crate) mod keeper;
pub(crate) mod key;
pub(crate) mod problem;
pub(crate) mod replay;
pub(crate) mod run;
pub(crate) mod scope;
#[cfg(feature = "postgres")]
pub(crate) mod transactional;
