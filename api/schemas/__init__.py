"""Request and response bodies, in families per resource: XCreate / XPublic / XsPublic."""
