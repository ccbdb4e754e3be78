"""Rendering of engine results: the unified diff, text for people, and JSON and
SARIF for machines. Renderers return strings; the CLI decides where they go."""
