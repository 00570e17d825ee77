//! weir control API.
