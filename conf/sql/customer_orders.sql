-- Every open order with its customer and the customer's region: a three-way join of two Kafka mirrors
-- (orders, customers) and a plain Delta table (regions). Used by conf/kafka_debezium.yaml.
SELECT
  o.id          AS order_id,
  o.created_at  AS ordered_at,
  o.amount,
  o.status,
  c.id          AS customer_id,
  c.name        AS customer_name,
  c.email,
  r.name        AS region
FROM orders o
JOIN customers c ON c.id = o.customer_id
LEFT JOIN regions r ON r.id = c.region_id
WHERE o.status <> 'cancelled'
