//! weir sidecar library.
