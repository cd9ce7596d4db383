"""Frontends translate wire formats into calls on edged.core.service.InferenceService and back."""
