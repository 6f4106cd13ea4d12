//! Reports for people: why an allocation ran out of memory ([`oom`]) and what a
//! scope left behind ([`leak`]).

pub mod leak;
pub mod oom;
