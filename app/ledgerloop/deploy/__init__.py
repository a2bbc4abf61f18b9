"""Versioned deploys: check the in-flight runs against new code, adopt the ones it can resume."""
