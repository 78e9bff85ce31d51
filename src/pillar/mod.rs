//! Reading pillar: merging values onto defaults ([`merge`]), the names the
//! registry accepts ([`names`]), the checks every value a state receives
//! passes ([`checks`], [`hosts`]) and typed readers of pillar scalars
//! ([`values`]). The ground floor of settings and drivers alike.

pub mod checks;
pub mod hosts;
pub mod merge;
pub mod names;
pub mod values;
