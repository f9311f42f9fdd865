"""Cross-cutting helpers: process-group communication, logging, event storage, environment info, stop signals."""
