"""Alerts an admin turns on in the console: rules evaluated by the daemon (edged.core.alerts.rules), delivered to a
webhook as signed JSON (edged.core.alerts.webhook) by a task of their own (edged.core.alerts.engine), within the
bounds of edged.core.alerts.bounds."""
