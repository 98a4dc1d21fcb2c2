//! dedupe core
