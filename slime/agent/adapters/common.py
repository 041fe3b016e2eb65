from slime.agent.records import TurnRecord
