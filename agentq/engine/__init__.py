"""Driving a thread: the node loop, what a node sees, lease keeping. No Celery here."""
