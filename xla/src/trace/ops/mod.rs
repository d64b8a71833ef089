//! Op families, one file each: trace entry, shape rule, emission and VJP.

pub(crate) mod constant;
pub(crate) mod control;
pub(crate) mod custom;
pub(crate) mod dot;
pub(crate) mod elementwise;
pub(crate) mod gather;
pub(crate) mod reduce;
pub(crate) mod shape;
