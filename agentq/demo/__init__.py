"""``agentq demo``: a support agent on a real Celery worker that is SIGKILLed right after
issuing a refund, before recording it; a fresh worker resumes the thread from its checkpoint
and the refund is issued exactly once.

:mod:`agentq.demo.app` is the Celery app the demo's workers load; the demo configures it
through environment variables (:class:`agentq.demo.config.DemoConfig`).
"""
