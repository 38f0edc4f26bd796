"""Voxlane's front ends and process wiring: CLI, web app, WebSocket server, microphone."""
