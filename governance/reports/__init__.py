"""Human-readable reports built from the audit export (see ``governance.audit_export``)."""
