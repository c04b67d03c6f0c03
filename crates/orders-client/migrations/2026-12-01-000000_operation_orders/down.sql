DROP TABLE operation_orders;
