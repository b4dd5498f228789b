//! Where a run lives ([`RunRef`]), and the events of a run built from it.

/// Where a run lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunRef {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
}
