//! Tests of DNS names, settings, plans and records.
