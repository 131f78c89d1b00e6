"""The demo's Celery app, built the same way in the demo process and in its workers."""

from __future__ import annotations

from typing import Any

from celery import Celery

from agentq.celery.runtime import init_app
from agentq.demo.agent import DemoSupportAgent
from agentq.demo.config import DemoConfig


def transport_options(config: DemoConfig) -> dict[str, Any]:
    if config.embedded:
        # One folder serves as both ends of the queue; processed messages are not kept.
        messages = config.broker_folder("messages")
        return {
            "data_folder_in": messages,
            "data_folder_out": messages,
            "processed_folder": config.broker_folder("processed"),
            "control_folder": config.broker_folder("control"),
            "store_processed": False,
            "polling_interval": 0.1,
        }
    # Every broker key of the run under its namespace, so the demo can remove them all.
    return {"global_keyprefix": f"{config.namespace}:broker:"}


def build_app(config: DemoConfig) -> Celery:
    app = Celery("agentq-demo", broker=config.broker, set_as_current=False)
    app.conf.update(
        task_default_queue=config.queue,
        broker_transport_options=transport_options(config),
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        # The filesystem broker has no broadcast; workers report ready through the ledger.
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        demo_ledger=config.ledger,
        demo_namespace=config.namespace,
    )
    init_app(
        app,
        store=config.store,
        prefix=config.prefix,
        lease_ttl=config.lease_ttl,
        sweep_interval=config.sweep_interval,
        start_grace=config.start_grace,
    )
    app.register_task(DemoSupportAgent())
    return app
