"""Thin routers, one per resource."""
