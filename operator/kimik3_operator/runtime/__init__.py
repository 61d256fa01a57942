"""The machinery: watches, the store, the work queue, leader election, the manager that
runs them, and the bounded reads of pods' HTTP answers. Nothing outside this package
watches, queues or elects."""
